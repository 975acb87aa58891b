package zklock_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		holderMain() // the helper process of TestKillHolderProcess
		return
	}
	code := m.Run()
	stopServers(code != 0)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
