package zklock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/zklock"
)

// holderEnv, when set ("connect|root|key"), makes the test binary a lock
// holder process: it takes the lock, prints "HELD <token>" and waits to be
// killed.
const holderEnv = "ZKLOCK_TEST_HOLDER"

const killTTL = time.Second

func holderMain() {
	parts := strings.SplitN(os.Getenv(holderEnv), "|", 3)
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "bad", holderEnv)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zklock.New(ctx, parts[0], zklock.WithRoot(parts[1]), zklock.WithSessionTimeout(killTTL*3/2),
		zklock.WithClientOptions(core.WithDefaults(core.TTL(killTTL))))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := l.TryAcquire(ctx, parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("HELD %d\n", s.Token())
	<-s.Done() // until killed (or lost, which the parent sees as a failure)
	fmt.Fprintln(os.Stderr, "lost:", s.Err())
	os.Exit(3)
}

// TestKillHolderProcess: a holder process is killed with SIGKILL; another
// takes the lock over within 1.5 × TTL (the TTL runs out on the server
// clock at the latest 1 TTL after its last renewal, and the session at
// 1.5 × TTL).
func TestKillHolderProcess(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	root := testRoot()
	const key = "killed"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+connect+"|"+root+"|"+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	var held string
	select {
	case held = <-line:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder process did not take the lock")
	}
	if !strings.HasPrefix(held, "HELD ") {
		t.Fatalf("holder process: %q", held)
	}
	other := newLocker(t, newBackend(t, connect, root), core.TTL(killTTL))
	if _, err := other.TryAcquire(ctxT(t, 10*time.Second), key); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("the key is not busy while the holder process lives: %v", err)
	}
	time.Sleep(killTTL) // a few renewals
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s, err := other.Acquire(ctxT(t, 30*time.Second), key, core.Backoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	defer s.Release(context.Background())
	t.Logf("takeover %v after SIGKILL (TTL %v, holder %s)", took.Round(time.Millisecond), killTTL, strings.TrimSpace(held))
	if took > killTTL*3/2 {
		t.Errorf("takeover took %v, more than 1.5 × TTL", took)
	}
}
