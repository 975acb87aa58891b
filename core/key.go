package core

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key, in bytes, that dislock accepts.
const MaxKeyLen = 1024

// ValidateKey reports whether key is a valid lock key: 1 to MaxKeyLen bytes of
// valid UTF-8 without NUL. The error wraps ErrInvalidKey and says what is wrong.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key: %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key: not valid UTF-8", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: key: contains a NUL byte", ErrInvalidKey)
	}
	return nil
}
