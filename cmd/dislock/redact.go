package main

import (
	"context"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

const redacted = "xxxxx"

// Patterns of credentials in driver messages: the password of a URL's
// userinfo, and key=value passwords of DSNs and URL queries.
var (
	userinfoPassword = regexp.MustCompile(`(://[^/@\s:\[\]]*:)[^@\s\[\]]*@`)
	keyValuePassword = regexp.MustCompile(`(?i)(\b(?:password|passwd|pwd|sentinel_password)\s*=\s*)('[^']*'|"[^"]*"|[^\s&,;]+)`)
)

// redactor removes the backend URL and its credentials from text. It is
// configured once, before any goroutine logs, and read-only afterwards.
type redactor struct {
	secrets []string // longest first
	url     string
	urlName string
}

// newRedactor returns a redactor for the URL held by the variable urlName.
func newRedactor(urlName, rawURL string) *redactor {
	r := &redactor{url: rawURL, urlName: urlName}
	if rawURL == "" {
		return r
	}
	add := func(s string) {
		if len(s) >= 3 && !slices.Contains(r.secrets, s) {
			r.secrets = append(r.secrets, s)
		}
	}
	// The URL itself, unless it is no more than its scheme ("zk://"), which
	// is no secret and appears in the messages that explain the URLs. A
	// user name is no secret either: only passwords are redacted on their
	// own.
	if i := strings.Index(rawURL, "://"); i < 0 || len(rawURL)-i-3 >= 3 {
		add(rawURL)
	}
	addUser := func(user *url.Userinfo) {
		if user == nil {
			return
		}
		if p, ok := user.Password(); ok && p != "" {
			add(p)
			add(url.QueryEscape(p))
			add(url.PathEscape(p))
			add(user.String())
		}
	}
	if u, err := url.Parse(rawURL); err == nil {
		addUser(u.User)
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "pass") {
				for _, v := range vs {
					add(v)
					add(url.QueryEscape(v))
				}
			}
		}
	} else if i := strings.Index(rawURL, "://"); i >= 0 {
		// Unparsable URL: treat everything before the last '@' as secret.
		if j := strings.LastIndex(rawURL, "@"); j > i {
			add(rawURL[i+3 : j])
			// A host list (zk://, etcd://) is no URL host, but its
			// userinfo is a URL's: its password, decoded, is secret too.
			if u, err := url.Parse("x://" + rawURL[i+3:j] + "@h"); err == nil {
				addUser(u.User)
			}
		}
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// String returns s without the URL and credentials.
func (r *redactor) String(s string) string {
	if r != nil {
		for _, sec := range r.secrets {
			if strings.Contains(s, sec) {
				repl := redacted
				if sec == r.url && r.urlName != "" {
					repl = "$" + r.urlName
				}
				s = strings.ReplaceAll(s, sec, repl)
			}
		}
	}
	s = userinfoPassword.ReplaceAllString(s, "${1}"+redacted+"@")
	return keyValuePassword.ReplaceAllString(s, "${1}"+redacted)
}

// redactHandler is a slog.Handler that redacts the message and every
// attribute before passing the record on.
type redactHandler struct {
	r    *redactor
	next slog.Handler
}

func (h *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = h.attr(a)
	}
	return &redactHandler{r: h.r, next: h.next.WithAttrs(clean)}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{r: h.r, next: h.next.WithGroup(name)}
}

func (h *redactHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, ga := range g {
			clean[i] = h.attr(ga)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindString, slog.KindAny:
		return slog.String(a.Key, h.r.String(v.String()))
	}
	return slog.Attr{Key: a.Key, Value: v}
}
