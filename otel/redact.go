package otel

import (
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// secretWords are parameter names whose values redact removes, as in
// "password=x" (libpq keyword DSNs, URL queries).
var secretWords = []string{"password", "passwd", "pwd", "secret", "token", "apikey", "api_key", "access_key"}

// redact removes credentials from an error message: the userinfo of every
// URL ("scheme://user:pass@host" becomes "scheme://REDACTED@host") and the
// value of every password-like parameter ("password=x" becomes
// "password=REDACTED"). It is a best-effort filter for messages recorded on
// spans; error.type is the reliable, secret-free description of an error.
func redact(msg string) string {
	if strings.Contains(msg, "://") {
		msg = redactUserinfo(msg)
	}
	if strings.ContainsAny(msg, "=:") {
		msg = redactParams(msg)
	}
	return msg
}

// isURLEnd reports whether c ends a URL's authority in a message.
func isURLEnd(c byte) bool {
	switch c {
	case '/', '?', '#', ' ', '\t', '\n', '\r', '"', '\'', '`', '<', '>', ',', ';', ')', ']':
		return true
	}
	return false
}

func redactUserinfo(msg string) string {
	var b strings.Builder
	rest := msg
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		start := i + 3
		end := start
		for end < len(rest) && !isURLEnd(rest[end]) {
			end++
		}
		authority := rest[start:end]
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			b.WriteString(rest[:start])
			b.WriteString("REDACTED")
			b.WriteString(authority[at:])
		} else {
			b.WriteString(rest[:end])
		}
		rest = rest[end:]
	}
	if b.Len() == 0 {
		return msg
	}
	b.WriteString(rest)
	return b.String()
}

// isValueEnd reports whether c ends a parameter value.
func isValueEnd(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '&', ';', ',', '"', '\'', '`', ')', ']', '}':
		return true
	}
	return false
}

func redactParams(msg string) string {
	lower := strings.ToLower(msg)
	var b strings.Builder
	last := 0 // msg[:last] is written or skipped
	for i := 0; i < len(lower); i++ {
		for _, w := range secretWords {
			if !strings.HasPrefix(lower[i:], w) {
				continue
			}
			// Any name ending in a secret word counts (db_password,
			// sslpassword, auth_token), followed by an optional closing
			// quote and spaces, then = or :, as in password=x,
			// password: x, "password":"x".
			j := i + len(w)
			if j < len(lower) && (lower[j] == '"' || lower[j] == '\'') {
				j++
			}
			for j < len(lower) && lower[j] == ' ' {
				j++
			}
			if j >= len(lower) || (lower[j] != '=' && lower[j] != ':') {
				continue
			}
			j++
			for j < len(lower) && lower[j] == ' ' {
				j++
			}
			k := j
			if j < len(lower) && (lower[j] == '"' || lower[j] == '\'') {
				// A quoted value runs to its closing quote.
				j++
				k = strings.IndexByte(lower[j:], lower[j-1])
				if k < 0 {
					k = len(lower)
				} else {
					k += j
				}
			} else {
				for k < len(lower) && !isValueEnd(lower[k]) {
					k++
				}
			}
			if k == j || msg[j:k] == "REDACTED" {
				continue
			}
			b.WriteString(msg[last:j])
			b.WriteString("REDACTED")
			last = k
			i = k - 1
			break
		}
	}
	if last == 0 {
		return msg
	}
	b.WriteString(msg[last:])
	return b.String()
}

// fail marks span failed by err: error.type and status Error with a
// sanitized message.
func (o *Observer) fail(span trace.Span, err error, key string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrErrorType.String(core.ErrorType(err)))
	span.SetStatus(codes.Error, o.sanitize(err.Error(), key))
}

// sanitize removes credentials from msg and, unless keys are raw, the key.
func (o *Observer) sanitize(msg, key string) string {
	msg = redact(msg)
	if o.keyMode != KeyRaw && key != "" {
		msg = strings.ReplaceAll(msg, strconv.Quote(key), `"<key>"`)
		msg = strings.ReplaceAll(msg, key, "<key>")
	}
	return msg
}
