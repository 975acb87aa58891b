package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

// monoNow reads the system-wide monotonic clock, which every process on the
// machine shares (Go's own monotonic readings are relative to each process's
// start).
func monoNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// Environment of a holder subprocess.
const (
	childEnv        = "DISLOCK_CHAOS_CHILD"          // backend: "pg" or "redis"
	childURLEnv     = "DISLOCK_CHAOS_CHILD_URL"      // the store
	childRegEnv     = "DISLOCK_CHAOS_CHILD_REGISTER" // PostgreSQL URL of the fenced register
	childKeyEnv     = "DISLOCK_CHAOS_CHILD_KEY"
	childPrefixEnv  = "DISLOCK_CHAOS_CHILD_PREFIX"
	childStaleWrite = "DISLOCK_CHAOS_CHILD_PAUSE_BEFORE_WRITE"
)

// TestChaosHolderProcess is the body of a holder subprocess; it does nothing
// in a normal run. It acquires the key, reports each step as a JSON Event on
// stdout (times on the system-wide monotonic clock), and then either waits
// for a line on stdin before a fenced write (so that the parent can pause it
// between its validity check and the write), or waits to be killed.
func TestChaosHolderProcess(t *testing.T) {
	backend := os.Getenv(childEnv)
	if backend == "" {
		t.Skip("runs only as a holder subprocess of the long tier")
	}
	ctx := context.Background()
	enc := json.NewEncoder(os.Stdout)
	emit := func(e Event) { e.At = monoNow(); _ = enc.Encode(e) }
	key := os.Getenv(childKeyEnv)
	opts := []core.ClientOption{core.WithDefaults(shortTiming.options()...)}
	var l core.Locker
	switch backend {
	case "pg":
		pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if l, err = pg.New(ctx, pool, pg.WithTable(pgTable), pg.WithClientOptions(opts...)); err != nil {
			t.Fatal(err)
		}
	case "redis":
		ro, err := redis.ParseURL(os.Getenv(childURLEnv))
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(ro)
		defer c.Close()
		if l, err = redislock.New(c, redislock.WithPrefix(os.Getenv(childPrefixEnv)), redislock.WithClientOptions(opts...)); err != nil {
			t.Fatal(err)
		}
	}
	defer l.Close()
	reg, err := pgxpool.New(ctx, os.Getenv(childRegEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	r := &register{pool: reg}

	emit(Event{Kind: AcquireStart, Contender: "child", Key: key})
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s, err := l.Acquire(actx, key)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	emit(Event{Kind: AcquireOK, Contender: "child", Key: key, Hold: 1, Token: s.Token(), Deadline: monoNow() + time.Until(s.Deadline())})
	in := bufio.NewReader(os.Stdin)
	if os.Getenv(childStaleWrite) == "" {
		_, _ = in.ReadString('\n') // wait for SIGKILL
		return
	}
	if s.Err() != nil || !time.Now().Before(s.Deadline()) {
		t.Fatal("lost before the write")
	}
	emit(Event{Kind: "ready"})
	_, _ = in.ReadString('\n') // the parent stops this process here
	sent := monoNow()
	acc, seq, err := r.write(ctx, key, s.Token())
	emit(Event{Kind: FencedWrite, Contender: "child", Key: key, Hold: 1, Token: s.Token(), Sent: sent, Accepted: acc, Value: seq, Err: errString(err)})
	emit(Event{Kind: ReleaseStart, Contender: "child", Key: key, Hold: 1, Token: s.Token()})
	_ = s.Release(ctx)
	emit(Event{Kind: HoldEnd, Contender: "child", Key: key, Hold: 1, Token: s.Token(), Deadline: monoNow() + time.Until(s.Deadline())})
}

// holder is a running holder subprocess.
type holder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan Event
}

func startHolder(t *testing.T, env []string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChaosHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin, events: make(chan Event, 16)}
	go func() {
		defer close(h.events)
		dec := json.NewDecoder(out)
		for {
			var e Event
			if err := dec.Decode(&e); err != nil {
				// Lines the test framework prints (PASS, ok) end the stream.
				return
			}
			h.events <- e
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

func (h *holder) next(t *testing.T, kind Kind) Event {
	t.Helper()
	select {
	case e, ok := <-h.events:
		if !ok || e.Kind != kind {
			t.Fatalf("holder subprocess: got %v (open %v), want %s", e, ok, kind)
		}
		return e
	case <-time.After(15 * time.Second):
		t.Fatalf("holder subprocess: no %s", kind)
	}
	return Event{}
}

// TestChaosHolderPauseKill (long tier) stops a holder subprocess with
// SIGSTOP between its validity check and its fenced write until its lease
// expired and another contender took the key: the register must reject the
// resumed holder's write. Then it kills a holder with SIGKILL: the key must
// be free again within the TTL.
func TestChaosHolderPauseKill(t *testing.T) {
	if !longTier() {
		t.Skip("long tier: -chaos.long or DISLOCK_CHAOS_LONG=1")
	}
	pu := pgURL(t)
	for _, backend := range []string{"pg", "redis"} {
		t.Run(backend, func(t *testing.T) {
			seed := firstSeed()
			prefix := fmt.Sprintf("chaos-%d-", seed)
			key := prefix + "paused"
			ctx := context.Background()
			direct := directPool(t, pu, "dislock-chaos-direct")
			defer direct.Close()
			reg, err := newRegister(ctx, direct, []string{key})
			if err != nil {
				t.Fatal(err)
			}
			env := []string{childEnv + "=" + backend, childRegEnv + "=" + pu.String(), childKeyEnv + "=" + key,
				childPrefixEnv + "=dislock-" + prefix}
			var l core.Locker
			switch backend {
			case "pg":
				env = append(env, childURLEnv+"="+pu.String())
				if _, err := pg.NewBackend(ctx, direct, pg.WithTable(pgTable), pg.WithAutoMigrate()); err != nil {
					t.Fatal(err)
				}
				l, err = pg.New(ctx, direct, pg.WithTable(pgTable), pg.WithClientOptions(core.WithDefaults(shortTiming.options()...)))
			case "redis":
				srv := startRedis(t, sentinelPW)
				if srv == nil {
					t.Skip("redis-server is not installed")
				}
				u := &url.URL{Scheme: "redis", Host: srv.addr(), User: url.UserPassword("", sentinelPW), Path: "/0"}
				env = append(env, childURLEnv+"="+u.String())
				c := redis.NewClient(&redis.Options{Addr: srv.addr(), Password: sentinelPW})
				defer c.Close()
				l, err = redislock.New(c, redislock.WithPrefix("dislock-"+prefix), redislock.WithClientOptions(core.WithDefaults(shortTiming.options()...)))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()

			rec := NewRecorder(seed)
			offset := monoNow() - rec.Now()
			conv := func(e Event) Event {
				e.At -= offset
				if e.Deadline != 0 {
					e.Deadline -= offset
				}
				if e.Sent != 0 {
					e.Sent -= offset
				}
				return e
			}

			// Pause between the check and the write.
			h := startHolder(t, append(env, childStaleWrite+"=1"))
			rec.Add(conv(h.next(t, AcquireStart)))
			rec.Add(conv(h.next(t, AcquireOK)))
			h.next(t, "ready")
			if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			rec.Add(Event{Kind: FaultStart, Fault: "holder SIGSTOP"})
			_, _ = io.WriteString(h.stdin, "go\n")
			time.Sleep(shortTiming.ttl + 300*time.Millisecond)
			rec.Add(Event{Kind: AcquireStart, Contender: "parent", Key: key})
			actx, cancel := context.WithTimeout(ctx, 3*shortTiming.ttl)
			s, err := l.Acquire(actx, key)
			cancel()
			if err != nil {
				t.Fatalf("the paused holder's key was not freed: %v", err)
			}
			rec.Add(Event{Kind: AcquireOK, Contender: "parent", Key: key, Hold: 2, Token: s.Token(), Deadline: rec.Since(s.Deadline())})
			sent := rec.Now()
			acc, seq, err := reg.write(ctx, key, s.Token())
			rec.Add(Event{Kind: FencedWrite, Contender: "parent", Key: key, Hold: 2, Token: s.Token(), Sent: sent, Accepted: acc, Value: seq, Err: errString(err)})
			rec.Add(Event{Kind: ReleaseStart, Contender: "parent", Key: key, Hold: 2})
			_ = s.Release(ctx)
			rec.Add(Event{Kind: HoldEnd, Contender: "parent", Key: key, Hold: 2, Deadline: rec.Since(s.Deadline())})
			if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			rec.Add(Event{Kind: FaultEnd, Fault: "holder SIGSTOP"})
			w := conv(h.next(t, FencedWrite))
			rec.Add(w)
			for e := range h.events {
				rec.Add(conv(e))
			}
			if w.Accepted {
				t.Errorf("the register accepted the resumed holder's stale token %d", w.Token)
			}
			rep := Check(rec.History(), Config{RenewDeadline: shortTiming.deadline, Slack: 100 * time.Millisecond, LossSlack: lossSlack})
			if !rep.OK() {
				t.Errorf("seed %d:\n%s", seed, rep)
			}

			// Kill a holder: its key frees within the TTL.
			k := startHolder(t, env)
			k.next(t, AcquireStart)
			k.next(t, AcquireOK)
			_ = k.cmd.Process.Kill()
			killed := time.Now()
			actx, cancel = context.WithTimeout(ctx, 3*shortTiming.ttl)
			s, err = l.Acquire(actx, key)
			cancel()
			if err != nil {
				t.Fatalf("the killed holder's key was not freed: %v", err)
			}
			if d := time.Since(killed); d > shortTiming.ttl+500*time.Millisecond {
				t.Errorf("the killed holder's key took %v to free (TTL %v)", d, shortTiming.ttl)
			}
			_ = s.Release(ctx)
		})
	}
}
