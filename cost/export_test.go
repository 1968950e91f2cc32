package cost

// MaxNestingDepth lets the external tests build payloads at the nesting
// limit.
const MaxNestingDepth = maxNestingDepth
