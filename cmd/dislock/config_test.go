package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

const testURL = "postgres://u:s3cr3t@localhost/db"

func TestParseDefaults(t *testing.T) {
	inv, err := parseArgs([]string{"DATABASE_URL", "echo", "hi"}, envOf("DATABASE_URL", testURL, "LOCK_KEY", "job", "CRON_SCHEDULE", "*/5 * * * *"))
	if err != nil {
		t.Fatal(err)
	}
	r := inv.run
	if inv.url != testURL || inv.urlEnv != "DATABASE_URL" || strings.Join(r.command, " ") != "echo hi" {
		t.Errorf("url/env/command: %q %q %q", inv.url, inv.urlEnv, r.command)
	}
	if !r.useSchedule || r.useLease {
		t.Errorf("default strategy should be schedule only: %+v", r)
	}
	if r.ttl != 60*time.Second || r.interval != 10*time.Second || r.renewDeadline != 40*time.Second {
		t.Errorf("ttl %v interval %v renew deadline %v", r.ttl, r.interval, r.renewDeadline)
	}
	if r.grace != 10*time.Second || r.busyExit != 0 || r.onLossCont || r.jitter != 0 {
		t.Errorf("grace %v busy %d cont %v jitter %v", r.grace, r.busyExit, r.onLossCont, r.jitter)
	}
	if inv.level != slog.LevelWarn {
		t.Errorf("level %v, want WARNING by default", inv.level)
	}
	if r.scheduleKey() != "cronjob-lock:schedule:job" || r.leaseKey() != "cronjob-lock:lease:job" {
		t.Errorf("keys %q %q", r.scheduleKey(), r.leaseKey())
	}
}

// The lease interval defaults to clamp(TTL×0.3, 1s, 10s), kept below 2/3 TTL.
func TestLeaseIntervalDefault(t *testing.T) {
	for ttl, want := range map[string]time.Duration{
		"60": 10 * time.Second, "20": 6 * time.Second, "1": time.Second / 3, "2": time.Second, "3": time.Second, "1000": 10 * time.Second,
	} {
		inv, err := parseArgs([]string{"U", "true"}, envOf("U", testURL, "LOCK_KEY", "k", "LOCK_STRATEGY", "lease", "RUN_LOCK_TTL_SECONDS", ttl))
		if err != nil {
			t.Fatal(ttl, err)
		}
		if inv.run.interval != want {
			t.Errorf("TTL %s: interval %v, want %v", ttl, inv.run.interval, want)
		}
		if inv.run.interval >= inv.run.renewDeadline || inv.run.renewDeadline >= inv.run.ttl {
			t.Errorf("TTL %s: need interval %v < renew deadline %v < TTL %v", ttl, inv.run.interval, inv.run.renewDeadline, inv.run.ttl)
		}
	}
}

// Flags win over the environment; "--" after URL_ENV is accepted.
func TestFlagsWin(t *testing.T) {
	env := envOf("U", testURL, "LOCK_KEY", "envkey", "LOCK_STRATEGY", "bogus", "RUN_LOCK_TTL_SECONDS", "abc", "CRONJOB_LOCK_LOG_LEVEL", "DEBUG")
	inv, err := parseArgs([]string{"--key", "flagkey", "--strategy=lease,schedule", "--schedule", "@hourly", "--ttl", "30", "--lease-interval", "2.5",
		"--log-level", "error", "--busy-exit-code", "3", "--on-lease-loss", "continue", "--grace", "1m", "--jitter", "0.5",
		"U", "--", "sh", "-c", "exit 3"}, env)
	if err != nil {
		t.Fatal(err)
	}
	r := inv.run
	if r.key != "flagkey" || !r.useLease || !r.useSchedule || r.ttl != 30*time.Second || r.interval != 2500*time.Millisecond ||
		inv.level != slog.LevelError || r.busyExit != 3 || !r.onLossCont || r.grace != time.Minute || r.jitter != 500*time.Millisecond {
		t.Errorf("flags not applied: %+v level %v", r, inv.level)
	}
	if strings.Join(r.command, "|") != "sh|-c|exit 3" {
		t.Errorf("command %q", r.command)
	}
}

// Every bad setting is a usage error that names the setting.
func TestBadSettings(t *testing.T) {
	base := []string{"U", testURL, "LOCK_KEY", "k", "CRON_SCHEDULE", "* * * * *"}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"key missing", []string{"LOCK_KEY", ""}, nil, "LOCK_KEY"},
		{"key too long", []string{"LOCK_KEY", strings.Repeat("k", 2000)}, nil, "LOCK_KEY"},
		{"key invalid utf8", []string{"LOCK_KEY", "\xff"}, nil, "LOCK_KEY"},
		{"strategy unknown", []string{"LOCK_STRATEGY", "weekly"}, nil, "LOCK_STRATEGY"},
		{"strategy twice", []string{"LOCK_STRATEGY", "lease,lease"}, nil, "LOCK_STRATEGY"},
		{"strategy empty part", []string{"LOCK_STRATEGY", "schedule,"}, nil, "LOCK_STRATEGY"},
		{"schedule missing", []string{"CRON_SCHEDULE", ""}, nil, "CRON_SCHEDULE"},
		{"schedule bad", []string{"CRON_SCHEDULE", "61 * * * *"}, nil, "CRON_SCHEDULE"},
		{"schedule descriptor bad", []string{"CRON_SCHEDULE", "@fortnightly"}, nil, "CRON_SCHEDULE"},
		{"ttl text", []string{"RUN_LOCK_TTL_SECONDS", "abc"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{"ttl zero", []string{"RUN_LOCK_TTL_SECONDS", "0"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{"ttl negative", []string{"RUN_LOCK_TTL_SECONDS", "-5"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{"ttl NaN", []string{"RUN_LOCK_TTL_SECONDS", "NaN"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{"interval text", []string{"LOCK_LEASE_INTERVAL", "often"}, nil, "LOCK_LEASE_INTERVAL"},
		{"interval zero", []string{"LOCK_LEASE_INTERVAL", "0"}, nil, "LOCK_LEASE_INTERVAL"},
		{"interval above ttl", []string{"LOCK_LEASE_INTERVAL", "61"}, nil, "LOCK_LEASE_INTERVAL"},
		{"interval equal ttl", []string{"LOCK_LEASE_INTERVAL", "60"}, nil, "LOCK_LEASE_INTERVAL"},
		{"jitter negative", []string{"LOCK_JITTER_SECONDS", "-1"}, nil, "LOCK_JITTER_SECONDS"},
		{"jitter text", []string{"LOCK_JITTER_SECONDS", "some"}, nil, "LOCK_JITTER_SECONDS"},
		{"on loss", []string{"LOCK_ON_LEASE_LOSS", "ignore"}, nil, "LOCK_ON_LEASE_LOSS"},
		{"grace negative", []string{"DISLOCK_GRACE_SECONDS", "-1"}, nil, "DISLOCK_GRACE_SECONDS"},
		{"busy code", []string{"DISLOCK_BUSY_EXIT_CODE", "300"}, nil, "DISLOCK_BUSY_EXIT_CODE"},
		{"busy code text", []string{"DISLOCK_BUSY_EXIT_CODE", "x"}, nil, "DISLOCK_BUSY_EXIT_CODE"},
		{"limit zero", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "0"}, nil, "LOCK_LIMIT"},
		{"limit negative", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "-2"}, nil, "LOCK_LIMIT"},
		{"limit text", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "many"}, nil, "LOCK_LIMIT"},
		{"limit fraction", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "1.5"}, nil, "LOCK_LIMIT"},
		{"limit above max", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "10001"}, nil, "LOCK_LIMIT"},
		{"limit huge", []string{"LOCK_STRATEGY", "lease", "LOCK_LIMIT", "99999999999999999999999"}, nil, "LOCK_LIMIT"},
		{"limit flag", []string{"LOCK_STRATEGY", "lease"}, []string{"--limit", "0"}, "--limit"},
		{"limit without lease", []string{"LOCK_LIMIT", "3"}, nil, "LOCK_STRATEGY"},
		{"ttl flag", nil, []string{"--ttl", "x"}, "--ttl"},
		{"url env unset", nil, []string{"NOPE"}, "NOPE"},
		{"url env not a name", nil, []string{"1-2"}, "URL_ENV"},
		{"unknown flag", nil, []string{"--bogus"}, "bogus"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := envOf(append(append([]string{}, base...), tc.env...)...)
			args := tc.args
			if len(args) == 0 || strings.HasPrefix(args[0], "--") {
				args = append(args, "U", "true")
			} else {
				args = append(args, "true")
			}
			_, err := parseArgs(args, env)
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("want a usage error, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

func TestUsageForms(t *testing.T) {
	env := envOf("DATABASE_URL", testURL, "OTHER", testURL)
	for _, tc := range []struct {
		args []string
		ok   bool
		sub  string
	}{
		{[]string{"status", "cronjob-lock:lease:k"}, true, subStatus},
		{[]string{"status", "--url-env", "OTHER", "k"}, true, subStatus},
		{[]string{"status"}, false, ""},
		{[]string{"list"}, true, subList},
		{[]string{"list", "cronjob-lock:", "--url-env=OTHER"}, true, subList},
		{[]string{"list", "a", "b"}, false, ""},
		{[]string{"release", "k"}, false, ""},
		{[]string{"release", "k", "--force"}, true, subRelease},
		{[]string{"status", "--force", "k"}, false, ""},
		{[]string{"DATABASE_URL"}, false, ""},
		{[]string{}, false, ""},
	} {
		inv, err := parseArgs(tc.args, env)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v", tc.args, err)
			continue
		}
		if err == nil && inv.sub != tc.sub {
			t.Errorf("%q: sub %q", tc.args, inv.sub)
		}
	}
	inv, err := parseArgs([]string{"--help"}, env)
	if err != nil || !inv.help {
		t.Fatalf("--help: %v", err)
	}
	var out bytes.Buffer
	newCLI(&out, &out, env).usage(&out)
	for _, sp := range specAllForHelp {
		if !strings.Contains(out.String(), "--"+sp.flag) || (sp.env != "" && !strings.Contains(out.String(), "$"+sp.env)) {
			t.Errorf("help does not list --%s with $%s", sp.flag, sp.env)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "WARNING": slog.LevelWarn, "warn": slog.LevelWarn, "ERROR": slog.LevelError} {
		if got, err := parseLevel(in); got != want || err != nil {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	if _, err := parseLevel("verbose"); err == nil {
		t.Errorf("unknown level accepted")
	}
}

func TestSchedule(t *testing.T) {
	s, tol, err := parseSchedule("@every 10s")
	if err != nil || tol != time.Second {
		t.Fatal(tol, err)
	}
	at := time.Date(2025, 1, 1, 12, 0, 3, 0, time.UTC)
	if got := s.Next(at); !got.Equal(at.Add(7 * time.Second)) {
		t.Errorf("@every 10s is not epoch-aligned: %v", got)
	}
	if _, tol, _ := parseSchedule("@every 2s"); tol != 500*time.Millisecond {
		t.Errorf("@every 2s: tolerance %v", tol)
	}
	s, _, err = parseSchedule("*/15 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Next(at); got.Minute() != 15 || got.Second() != 0 {
		t.Errorf("*/15: %v", got)
	}
	if _, _, err := parseSchedule("@every 100ms"); err == nil {
		t.Error("sub-second @every accepted")
	}
}

// The kill comes after the grace period, or earlier when the lease could
// pass to another holder first.
func TestKillDeadline(t *testing.T) {
	now := time.Now()
	cfg := &runConfig{ttl: 60 * time.Second, renewDeadline: 40 * time.Second, grace: 10 * time.Second}
	// Lost at the local deadline: 20s of server lease left, minus a quarter.
	if got := killDeadline(now, now, cfg).Sub(now); got != 10*time.Second {
		t.Errorf("grace-bound: %v", got)
	}
	cfg.grace = time.Minute
	if got := killDeadline(now, now, cfg).Sub(now); got != 15*time.Second {
		t.Errorf("lease-bound: %v", got)
	}
	if got := killDeadline(now, now.Add(-time.Hour), cfg); !got.Equal(now) {
		t.Errorf("past: %v", got)
	}
}

func TestRedact(t *testing.T) {
	u := "redis://user:p%40ss@host:6379/0?sentinel_password=sp1234"
	r := newRedactor("REDIS_URL", u)
	for _, in := range []string{
		"dial " + u + " failed",
		"password p@ss rejected, p%40ss",
		"sentinel sp1234",
		"cannot parse `postgres://bob:hunter2@db/x`",
		"host=db user=bob password=hunter2 dbname=x",
		"user:p@ss@host",
	} {
		out := r.String(in)
		for _, secret := range []string{"p@ss", "p%40ss", "sp1234", "hunter2", u} {
			if strings.Contains(out, secret) {
				t.Errorf("%q -> %q still contains %q", in, out, secret)
			}
		}
	}
	if got := r.String("dial " + u); !strings.Contains(got, "$REDIS_URL") {
		t.Errorf("URL not named: %q", got)
	}
}

func TestCommaHosts(t *testing.T) {
	for in, want := range map[string]string{
		"redis://h1:1,h2:2,h3:3/0?master_name=m": "redis://h1:1/0?master_name=m&addr=h2:2&addr=h3:3",
		"redis://:pw@h1:1,h2:2":                  "redis://:pw@h1:1?addr=h2:2",
		"redis://h1:1/0":                         "redis://h1:1/0",
	} {
		if got := commaHosts(in); got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}

// A cron value, range or step outside its field is a usage error naming
// CRON_SCHEDULE and the field, not a silently different schedule (*/61 in
// the minutes would be hourly); 6 fields point to @every for seconds.
func TestScheduleOutOfField(t *testing.T) {
	for spec, want := range map[string]string{
		"*/61 * * * *":   "minute field",
		"*/60 * * * *":   "minute field",
		"0 */24 * * *":   "hour field",
		"0 0 */32 * *":   "day of month field",
		"0 0 * 1-13 *":   "month field",
		"0 0 * * */7":    "day of week field",
		"*/30 * * * * *": "@every",
	} {
		_, err := parseArgs([]string{"U", "true"}, envOf("U", testURL, "LOCK_KEY", "k", "CRON_SCHEDULE", spec))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "CRON_SCHEDULE") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want a usage error naming CRON_SCHEDULE and %q", spec, err, want)
		}
	}
	if _, err := parseArgs([]string{"U", "true"}, envOf("U", testURL, "LOCK_KEY", "k", "CRON_SCHEDULE", "*/59 * * * *")); err != nil {
		t.Errorf("*/59: %v", err)
	}
}

// A URL passed where the variable's name belongs is never quoted back, with
// or without a password, in the run form or with --url-env.
func TestURLInPlaceOfName(t *testing.T) {
	for _, u := range []string{"postgres://u:s3cr3t@db.example/app", "postgres://db.example/app", "redis://db.example:6379/0"} {
		for _, args := range [][]string{{u, "true"}, {"status", "--url-env", u, "k"}, {"list", "--url-env=" + u}} {
			_, err := parseArgs(args, envOf("LOCK_KEY", "k", "CRON_SCHEDULE", "@hourly"))
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), "URL_ENV") {
				t.Fatalf("%q: %v, want a usage error naming URL_ENV", args, err)
			}
			if strings.Contains(err.Error(), "db.example") || strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("%q: the error shows the URL: %v", args, err)
			}
		}
	}
}

// DISLOCK_CREATE_TABLE / --create-table is a yes/no setting of the run form.
func TestCreateTableSetting(t *testing.T) {
	base := []string{"U", testURL, "LOCK_KEY", "k", "CRON_SCHEDULE", "@hourly"}
	for _, tc := range []struct {
		env  []string
		args []string
		want bool
		ok   bool
	}{
		{nil, nil, false, true},
		{[]string{"DISLOCK_CREATE_TABLE", "1"}, nil, true, true},
		{[]string{"DISLOCK_CREATE_TABLE", "false"}, nil, false, true},
		{nil, []string{"--create-table"}, true, true},
		{[]string{"DISLOCK_CREATE_TABLE", "maybe"}, nil, false, false},
	} {
		inv, err := parseArgs(append(tc.args, "U", "true"), envOf(append(append([]string{}, base...), tc.env...)...))
		if (err == nil) != tc.ok || (err == nil && inv.create != tc.want) {
			t.Errorf("%v %v: %+v %v", tc.env, tc.args, inv, err)
		}
		if err != nil && !strings.Contains(err.Error(), "DISLOCK_CREATE_TABLE") {
			t.Errorf("error does not name the setting: %v", err)
		}
	}
	if _, err := parseArgs([]string{"list", "--create-table"}, envOf("DATABASE_URL", testURL)); err == nil {
		t.Error("list --create-table accepted")
	}
	// The environment of the runs may set DISLOCK_CREATE_TABLE: the operator
	// subcommands ignore it.
	for _, args := range [][]string{{"status", "--url-env", "DATABASE_URL", "k"}, {"list", "--url-env", "DATABASE_URL"}, {"release", "--force", "--url-env", "DATABASE_URL", "k"}} {
		for _, v := range []string{"1", "maybe"} {
			inv, err := parseArgs(args, envOf("DATABASE_URL", testURL, "DISLOCK_CREATE_TABLE", v))
			if err != nil || inv.create {
				t.Errorf("%v with DISLOCK_CREATE_TABLE=%s: %+v %v", args, v, inv, err)
			}
		}
	}
}

// The busy message of a schedule lock says the slot has already run, when
// and by whom; a busy lease names the run that holds it.
func TestBusyMessage(t *testing.T) {
	cfg := &runConfig{key: "job"}
	h := &core.Info{Owner: "host-a:4242", Token: 7, AcquiredAt: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), ExpiresAt: time.Date(2026, 1, 2, 3, 59, 59, 0, time.UTC), Remaining: time.Minute}
	msg := busyMessage(cfg.scheduleKey(), cfg, h)
	for _, want := range []string{"already run", "2026-01-02T03:04:00Z", "host-a:4242", "2026-01-02T03:59:59Z"} {
		if !strings.Contains(msg, want) {
			t.Errorf("schedule: %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "held elsewhere") {
		t.Errorf("schedule: %q", msg)
	}
	msg = busyMessage(cfg.leaseKey(), cfg, h)
	if !strings.Contains(msg, "held by another run") || !strings.Contains(msg, "host-a:4242") {
		t.Errorf("lease: %q", msg)
	}
}

// LOCK_LIMIT defaults to 1 (a mutex, as before); --limit wins over it; a
// limit above 1 needs the lease strategy, and 1 works with any.
func TestLimitSetting(t *testing.T) {
	parse := func(args []string, kv ...string) (*invocation, error) {
		env := envOf(append([]string{"U", testURL, "LOCK_KEY", "k", "CRON_SCHEDULE", "@hourly"}, kv...)...)
		return parseArgs(append(args, "U", "true"), env)
	}
	inv, err := parse(nil)
	if err != nil || inv.run.limit != 1 {
		t.Fatalf("default: limit %v, err %v; want 1", inv.run.limit, err)
	}
	inv, err = parse(nil, "LOCK_STRATEGY", "lease", "LOCK_LIMIT", " 3 ")
	if err != nil || inv.run.limit != 3 {
		t.Fatalf("LOCK_LIMIT=3: limit %v, err %v", inv.run.limit, err)
	}
	inv, err = parse([]string{"--limit", "5"}, "LOCK_STRATEGY", "schedule,lease", "LOCK_LIMIT", "3")
	if err != nil || inv.run.limit != 5 {
		t.Fatalf("--limit 5 over LOCK_LIMIT=3: limit %v, err %v", inv.run.limit, err)
	}
	inv, err = parse(nil, "LOCK_LIMIT", "1")
	if err != nil || inv.run.limit != 1 {
		t.Fatalf("LOCK_LIMIT=1 with the schedule strategy: limit %v, err %v", inv.run.limit, err)
	}
	inv, err = parse(nil, "LOCK_STRATEGY", "lease", "LOCK_LIMIT", "10000")
	if err != nil || inv.run.limit != core.MaxLimit {
		t.Fatalf("LOCK_LIMIT=10000: limit %v, err %v", inv.run.limit, err)
	}
	_, err = parse(nil, "LOCK_LIMIT", "3")
	if err == nil || !strings.Contains(err.Error(), "LOCK_LIMIT") || !strings.Contains(err.Error(), "lease") {
		t.Errorf("LOCK_LIMIT=3 with the schedule strategy: %v, want an error naming LOCK_LIMIT and the lease strategy", err)
	}
}

// A busy semaphore says that the limit is reached, and names the lease that
// ends first.
func TestBusyMessageLimit(t *testing.T) {
	cfg := &runConfig{key: "job", limit: 3}
	h := &core.Info{Owner: "host-a:4242", Token: 7, AcquiredAt: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), Remaining: time.Minute, Limit: 3}
	msg := busyMessage(cfg.leaseKey(), cfg, h)
	for _, want := range []string{"3 instances", "LOCK_LIMIT", "host-a:4242", "token 7"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
}

// A permit's line ends in limit=N; a mutex's line is as before.
func TestHeldLineLimit(t *testing.T) {
	info := core.Info{Key: "k", Owner: "o", Token: 1}
	if line := heldLine(info); strings.Contains(line, "limit=") || !strings.HasSuffix(line, "remaining=0s\n") {
		t.Errorf("mutex line %q", line)
	}
	info.Limit = 4
	if line := heldLine(info); !strings.HasSuffix(line, "\tlimit=4\n") {
		t.Errorf("permit line %q", line)
	}
}
