package otel

import "testing"

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"refused", "refused"},
		{"dial postgres://u:pw@h:5432/db: refused", "dial postgres://REDACTED@h:5432/db: refused"},
		{"redis://:pw@h:6379", "redis://REDACTED@h:6379"},
		{"a://x@y b://c:d@e/f", "a://REDACTED@y b://REDACTED@e/f"},
		{"url http://host/path?q=1", "url http://host/path?q=1"},
		{"host=h user=u password=secret dbname=d", "host=h user=u password=REDACTED dbname=d"},
		{"PASSWORD = 'se cret' x", "PASSWORD = 'REDACTED' x"},
		{"password='unterminated", "password='REDACTED"},
		{`{"password":"x","token": "y"}`, `{"password":"REDACTED","token": "REDACTED"}`},
		{"?sslpassword=x&a=b", "?sslpassword=REDACTED&a=b"},
		{"db_password: x", "db_password: REDACTED"},
		{"a=1&pwd=x", "a=1&pwd=REDACTED"},
		{"token 5", "token 5"},
	} {
		if got := redact(c.in); got != c.want {
			t.Errorf("redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
