package cost

// MaxNestingDepth lets the external tests build payloads at the nesting
// limit.
const MaxNestingDepth = maxNestingDepth

// The kinds of ErrMalformed the external tests tell apart.
var (
	ErrEmptyPayload  = errEmptyPayload
	ErrUnknownFormat = errUnknownFormat
)
