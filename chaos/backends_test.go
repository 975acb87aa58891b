package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

const pgTable = "dislock_chaos_locks"

// directPool connects to PostgreSQL without the proxy.
func directPool(t testing.TB, u *url.URL, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatalf("parse PostgreSQL URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	return pool
}

// proxiedPGConfig is a pool configuration through the proxy, with the
// sentinel password in its URL.
func proxiedPGConfig(t testing.TB, u *url.URL, px *Proxy, app string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(viaProxy(u, px.Addr(), "", sentinelPW))
	if err != nil {
		t.Fatalf("parse proxied URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.ConnectTimeout = time.Second
	cfg.MaxConns = 4
	return cfg
}

func pgSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	u := pgURL(t)
	px := addProxy(t, h, "pg", u.Host)
	app := "dislock-chaos-" + strings.TrimSuffix(prefix, "-")
	ctx := context.Background()
	direct := directPool(t, u, "dislock-chaos-direct")
	adminB, err := pg.NewBackend(ctx, direct, pg.WithTable(pgTable), pg.WithAutoMigrate())
	if err != nil {
		t.Fatalf("lock table: %v", err)
	}
	admin, err := core.New(adminB)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := newRegister(ctx, direct, keys)
	if err != nil {
		t.Fatal(err)
	}
	env := &backendEnv{name: "pg", proxy: px, admin: admin, reg: reg, keyPrefix: prefix}
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		pool, err := pgxpool.NewWithConfig(ctx, proxiedPGConfig(t, u, px, app))
		if err != nil {
			return nil, nil, err
		}
		l, err := pg.New(ctx, pool, pg.WithTable(pgTable), pg.WithClientOptions(opts...))
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return l, func() error { err := l.Close(); pool.Close(); return err }, nil
	}
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		// The rows' tokens as the deletion returns them, in one commit.
		sent := time.Now()
		removed := map[string][]uint64{}
		collect := func(rows pgx.Rows) error {
			var k string
			var tok int64
			_, err := pgx.ForEachRow(rows, []any{&k, &tok}, func() error {
				removed[k] = append(removed[k], uint64(tok))
				return nil
			})
			return err
		}
		var err error
		if env.limit <= 1 {
			rows, qerr := direct.Query(ctx, `DELETE FROM `+pgTable+` WHERE key = ANY($1) RETURNING key, token`, keys)
			if err = qerr; err == nil {
				err = collect(rows)
			}
		} else {
			// A semaphore: its header row, then (in a fresh snapshot, once
			// claims that held the header's row lock committed) its
			// permits, whose tokens are the permits' own.
			err = pgx.BeginFunc(ctx, direct, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `DELETE FROM `+pgTable+` WHERE key = ANY($1)`, keys); err != nil {
					return err
				}
				rows, err := tx.Query(ctx, `DELETE FROM `+pgTable+`_permits WHERE key = ANY($1) RETURNING key, token`, keys)
				if err != nil {
					return err
				}
				return collect(rows)
			})
		}
		if err != nil {
			return nil, err
		}
		return removals(keys, sent, removed), nil
	}
	probeCfg := proxiedPGConfig(t, u, px, app).ConnConfig
	env.probe = func(ctx context.Context) error {
		conn, err := pgx.ConnectConfig(ctx, probeCfg)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "SELECT 1")
		return err
	}
	env.faults = []faultDef{{name: "pg-terminate-storm", run: func(ctx context.Context, rng *mrand.Rand) error {
		end := time.Now().Add(between(rng, 500*time.Millisecond, 2*time.Second))
		for time.Now().Before(end) && ctx.Err() == nil {
			if _, err := direct.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil && ctx.Err() == nil {
				return fmt.Errorf("terminate backends: %w", err)
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		return nil
	}}}
	env.close = func() {
		_ = admin.Close()
		direct.Close()
	}
	return env
}

// removals are the removals of one deletion of keys sent at sent and
// answered now, with the tokens it removed by key.
func removals(keys []string, sent time.Time, removed map[string][]uint64) []removal {
	done := time.Now()
	out := make([]removal, 0, len(keys))
	for _, k := range keys {
		out = append(out, removal{key: k, sent: sent, done: done, tokens: removed[k]})
	}
	return out
}

// redisTarget is the Redis server a run uses: a private redis-server with
// the sentinel as its password when the binary is there, else the shared
// test server (no restart fault, pauses kept short).
type redisTarget struct {
	srv  *redisProc
	addr string
	pass string
	base *url.URL
}

func newRedisTarget(t *testing.T) *redisTarget {
	if srv := startRedis(t, sentinelPW); srv != nil {
		u, _ := url.Parse("redis://127.0.0.1/0")
		u.Host = srv.addr()
		return &redisTarget{srv: srv, addr: srv.addr(), pass: sentinelPW, base: u}
	}
	u := redisURL(t)
	pass, _ := u.User.Password()
	return &redisTarget{addr: u.Host, pass: pass, base: u}
}

func (rt *redisTarget) directClient() *redis.Client {
	opts, _ := redis.ParseURL(rt.base.String())
	opts.Addr = rt.addr
	opts.Password = rt.pass
	return redis.NewClient(opts)
}

// proxiedOptions are client options through the proxy, parsed from a URL
// that carries the sentinel password (as the server's password when the
// server is private).
func (rt *redisTarget) proxiedOptions(t testing.TB, px *Proxy) *redis.Options {
	t.Helper()
	raw := viaProxy(rt.base, px.Addr(), "", sentinelPW)
	if rt.pass != sentinelPW {
		// A shared server without that password: keep its own credentials.
		c := *rt.base
		c.Host = px.Addr()
		raw = c.String()
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("parse proxied Redis URL: %v", err)
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout = 500 * time.Millisecond
	opts.ReadTimeout = time.Second
	opts.WriteTimeout = time.Second
	opts.PoolSize = 4
	return opts
}

// redisDeleteLock deletes a lock (KEYS[1]: a mutex's string or a
// semaphore's permit set) and a semaphore's permit hash (KEYS[2]) in one
// script, and returns the fencing tokens of the claims in force it removed:
// a held mutex record ("<flags>|<token>|<acquired_us>|…"; a free record,
// "<flags>|<token>", is no claim) or the permits whose expiry, on the
// server's clock, has not passed.
var redisDeleteLock = redis.NewScript(`
local out = {}
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'string' then
  local tok = string.match(redis.call('GET', KEYS[1]), '^[^|]*|([^|]*)|[^|]*|')
  if tok then table.insert(out, tok) end
elseif t == 'zset' then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  for _, ot in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ms, '+inf')) do
    local p = redis.call('HGET', KEYS[2], 'p:' .. ot)
    if p then table.insert(out, string.match(p, '^(%S+)')) end
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
return out
`)

func redisSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	rt := newRedisTarget(t)
	px := addProxy(t, h, "redis", rt.addr)
	rprefix := "dislock-" + strings.TrimSuffix(prefix, "-")
	direct := rt.directClient()
	admin, err := redislock.New(direct, redislock.WithPrefix(rprefix))
	if err != nil {
		t.Fatal(err)
	}
	env := &backendEnv{name: "redis", proxy: px, admin: admin, keyPrefix: prefix,
		newLocker: redisLockers(func() *redis.Client { return redis.NewClient(rt.proxiedOptions(t, px)) }, rprefix)}
	closeReg := withRegister(t, env, keys)
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		var out []removal
		for _, k := range keys {
			// The lock (a semaphore's permit set) and a semaphore's permit
			// hash; the fencing counter stays.
			lock := rprefix + ":{" + k + "}"
			sent := time.Now()
			toks, err := redisDeleteLock.Run(ctx, direct, []string{lock, lock + ":sem"}).StringSlice()
			if err != nil {
				return out, err
			}
			rm := removal{key: k, sent: sent, done: time.Now()}
			for _, s := range toks {
				tok, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return out, fmt.Errorf("delete %s: token %q: %w", k, s, err)
				}
				rm.tokens = append(rm.tokens, tok)
			}
			out = append(out, rm)
		}
		return out, nil
	}
	probe := redis.NewClient(rt.proxiedOptions(t, px))
	env.probe = func(ctx context.Context) error { return probe.Ping(ctx).Err() }
	maxPause := 300 * time.Millisecond
	if rt.srv != nil {
		maxPause = 2 * time.Second
	}
	env.faults = []faultDef{{name: "redis-client-pause", run: func(ctx context.Context, rng *mrand.Rand) error {
		d := between(rng, 100*time.Millisecond, maxPause)
		if err := direct.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			return fmt.Errorf("client pause: %w", err)
		}
		sleepCtx(ctx, d)
		return nil
	}}}
	if rt.srv != nil {
		env.faults = append(env.faults, killRestart("redis-restart-empty", true, func() {
			sent := time.Now()
			rt.srv.kill()
			if env.lost != nil {
				env.lost("redis-restart-empty", removal{sent: sent, done: time.Now(), all: true})
			}
		}, rt.srv.start))
	}
	env.close = func() {
		_ = admin.Close()
		_ = probe.Close()
		_ = direct.Close()
		closeReg()
	}
	return env
}

// redisLockers returns a backendEnv.newLocker that builds each Locker on a
// client of its own from newClient, with the Redis key prefix rprefix.
func redisLockers[C redis.UniversalClient](newClient func() C, rprefix string) func(context.Context, ...core.ClientOption) (core.Locker, func() error, error) {
	return func(_ context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		client := newClient()
		l, err := redislock.New(client, redislock.WithPrefix(rprefix), redislock.WithSubscribeTimeout(time.Second),
			redislock.WithClientOptions(opts...))
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		return l, func() error { err := l.Close(); return errors.Join(err, client.Close()) }, nil
	}
}

// withRegister gives env the fenced register, on a direct pool of its own,
// when PostgreSQL answers. The returned function closes the pool.
func withRegister(t *testing.T, env *backendEnv, keys []string) func() {
	t.Helper()
	u, ok := optionalPG()
	if !ok {
		return func() {}
	}
	pool := directPool(t, u, "dislock-chaos-direct")
	reg, err := newRegister(context.Background(), pool, keys)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	env.reg = reg
	return pool.Close
}

// optionalPG returns the PostgreSQL URL when the server answers (the
// Redis run uses it only for the fenced register).
func optionalPG() (*url.URL, bool) {
	u, err := serverURL("DISLOCK_TEST_PG", defaultPG, "5432")
	return u, err == nil
}

// chaosSeeds runs the tier's seeds on one backend.
func chaosSeeds(t *testing.T, setup func(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv) {
	for i, seed := range seeds() {
		t.Run(fmt.Sprintf("seed%d", i), func(t *testing.T) {
			runChaos(t, tierRun(seed), setup)
		})
	}
}

func TestChaosPG(t *testing.T) {
	pgURL(t)
	chaosSeeds(t, pgSetup)
}

func TestChaosRedis(t *testing.T) { chaosSeeds(t, redisSetup) }

// TestChaosMySQL runs the tier on a private MariaDB server (the shared one
// when the binaries are missing, outside CI): the proxy's faults, deleted
// lock rows and the server killed and restarted with durable commits.
func TestChaosMySQL(t *testing.T) { chaosSeeds(t, mysqlSetup) }

// seeds is one seed in the short tier and a sweep in the long one.
func seeds() []uint64 {
	first := firstSeed()
	if !longTier() {
		return []uint64{first}
	}
	out := []uint64{first}
	for i := uint64(1); i < 5; i++ {
		out = append(out, first+i*7919)
	}
	return out
}

func tierRun(seed uint64) runConfig {
	cfg := shortRun(seed)
	if longTier() {
		cfg.contenders, cfg.keys, cfg.faultPhase = 6, 3, 60*time.Second
	}
	return cfg
}
