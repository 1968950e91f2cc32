package spillway

import "strconv"

// Secret is a string that never prints: String, GoString and text
// marshalling (which encoding/json and the YAML encoder use) all give
// "[redacted]" when it is set (and "" when it is not),
// so a Secret can sit in a configuration that is logged or formatted with
// %v, %+v or %#v. Convert it with string(s) where the value is really
// needed. Passwords in configurations (redisbroker.Config.Password, the
// router's redis.password) are Secrets.
type Secret string

// redacted is what a set Secret prints as.
const redacted = "[redacted]"

// String returns "[redacted]", or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, quoted, for %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// MarshalText writes the redacted form, for encoding/json, YAML and any
// other encoder that honours encoding.TextMarshaler.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
