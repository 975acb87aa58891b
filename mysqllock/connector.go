package mysqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"log"
	"net"
	"os"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// Connector returns a connector for cfg (see sql.OpenDB) that ends a
// statement whose ctx ends by closing its connection's socket, as Open's
// pool does, instead of handing each statement to the connection's
// watcher goroutine.
//
// go-sql-driver/mysql gives a statement whose ctx can end to a goroutine
// of its connection that watches the ctx, and takes it back when the
// statement returns: two goroutine hand-offs per statement, about 5 % of
// an uncontended acquire and release on a busy machine (BENCHMARKS.md). A
// connection of this connector instead registers a function on
// ctx (context.AfterFunc) that closes its socket, and sends the statement
// with a ctx that cannot end; the function runs only when ctx ends before
// the statement returns. Either way a statement returns soon after its ctx
// ends, with ctx's error, and its connection is discarded.
//
// It applies to the statements that do not open a transaction or return
// rows (ExecContext, of a connection or a prepared statement); the others
// are sent as the driver sends them. It dials "tcp" (and "tcp4", "tcp6")
// and "unix" addresses itself, as the driver does by default: a dial
// function registered for one of those networks with
// mysql.RegisterDialContext is not used. A cfg with a DialFunc, or with
// another network (one registered with RegisterDialContext), is dialed as
// the driver dials it, and its statements are all sent as the driver
// sends them. cfg is not changed.
func Connector(cfg *mysql.Config) (driver.Connector, error) {
	cfg = cfg.Clone()
	own := cfg.DialFunc == nil
	switch cfg.Net {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		own = false // a network registered with mysql.RegisterDialContext
	}
	if own {
		cfg.DialFunc = dialRecorded
		logger := cfg.Logger
		if logger == nil { // as the driver's default
			logger = log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)
		}
		cfg.Logger = quietCut{logger}
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return &connector{Connector: c}, nil
}

// socketKey is the context key under which connector.Connect passes a
// slot for the socket it dials (dialRecorded).
type socketKey struct{}

// dialRecorded dials as go-sql-driver/mysql does by default and records
// the socket in the slot of ctx.
func dialRecorded(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if slot, ok := ctx.Value(socketKey{}).(*net.Conn); ok && err == nil {
		*slot = nc
	}
	return nc, err
}

// quietCut is the driver's logger without the read and write errors of a
// socket that this process closed (net.ErrClosed): the errors of a
// statement that its ctx cut short, which go-sql-driver/mysql does not log
// when it cuts one itself.
type quietCut struct{ mysql.Logger }

func (q quietCut) Print(v ...any) {
	for _, x := range v {
		if err, ok := x.(error); ok && errors.Is(err, net.ErrClosed) {
			return
		}
	}
	q.Logger.Print(v...)
}

type connector struct{ driver.Connector }

// Connect implements driver.Connector.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	var nc net.Conn
	dc, err := c.Connector.Connect(context.WithValue(ctx, socketKey{}, &nc))
	if err != nil || nc == nil {
		return dc, err
	}
	return &conn{Conn: dc, nc: nc}, nil
}

// conn is a driver connection whose ExecContext calls end with their ctx
// by closing the socket nc (see Connector). The driver's connection has
// every optional interface used here.
type conn struct {
	driver.Conn
	nc  net.Conn
	cut atomic.Bool // nc was closed by a ctx that ended
}

// exec runs f, a statement on c, with a ctx that cannot end, and closes
// c's socket if ctx ends first. The statement's result stands when it
// came before the cut; otherwise its error is ctx's.
func (c *conn) exec(ctx context.Context, f func(context.Context) (driver.Result, error)) (driver.Result, error) {
	if ctx.Done() == nil {
		return f(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() {
		c.cut.Store(true)
		c.nc.Close()
	})
	r, err := f(context.WithoutCancel(ctx))
	if !stop() && err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
	}
	return r, err
}

func (c *conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.exec(ctx, func(ctx context.Context) (driver.Result, error) {
		return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
	})
}

func (c *conn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *conn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &stmt{Stmt: st, c: c}, nil
}

func (c *conn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *conn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, o)
}

func (c *conn) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c *conn) ResetSession(ctx context.Context) error {
	if c.cut.Load() {
		return driver.ErrBadConn
	}
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *conn) IsValid() bool { return !c.cut.Load() && c.Conn.(driver.Validator).IsValid() }

func (c *conn) CheckNamedValue(v *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(v)
}

// stmt is a prepared statement of conn c whose ExecContext calls end with
// their ctx as c's do.
type stmt struct {
	driver.Stmt
	c *conn
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.exec(ctx, func(ctx context.Context) (driver.Result, error) {
		return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	})
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *stmt) CheckNamedValue(v *driver.NamedValue) error {
	if nc, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return nc.CheckNamedValue(v)
	}
	return s.c.CheckNamedValue(v)
}
