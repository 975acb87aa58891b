package chaos

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// libLogs receives what go-redis logs internally (dial failures and the
// like), so that the secret sweeps search it too.
var libLogs = &sink{}

type redisLogger struct{}

// mysqlLogger receives what go-sql-driver logs (broken connections), for
// the same sweeps.
type mysqlLogger struct{}

func (mysqlLogger) Print(v ...any) { fmt.Fprintln(libLogs, v...) }

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(libLogs, format+"\n", v...)
}

func TestMain(m *testing.M) {
	if etcdMemberMain() { // a child process that runs an etcd server
		return
	}
	redis.SetLogger(redisLogger{})
	_ = mysql.SetLogger(mysqlLogger{})
	goleak.VerifyTestMain(m, toxiproxyStuck)
}
