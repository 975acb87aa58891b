package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/lane"
)

// The claim and release transactions are built as etcd's protobuf
// messages and sent with the KV service's Txn call on the client's
// connection, with the call options the client's own KV would use.
// clientv3's Txn builder clones every compare (twice for a nested
// transaction) and converts every operation again when it commits: most of
// the allocations of a claim that were not gRPC's own. A client whose KV is
// not clientv3's (a namespace, a wrapper) gets the same transactions
// through its KV.

// txnSender sends protobuf transactions for a Backend, through a lane
// (internal/lane): transactions made while others are on their way share
// one round trip and one Raft entry, each as a nested transaction of one
// that compares nothing. Only transactions on distinct keys are nested in
// one: a transaction may not write a key twice, and the nested
// transactions' compares are all made before any of their writes.
type txnSender struct {
	cli       *clientv3.Client
	direct    bool              // cli.KV is clientv3's own: call the KV service directly
	opts      []grpc.CallOption // the call options of cli's own KV
	maxTxnOps int
	lane      *lane.Lane[txnCall] // nil unless direct
}

// txnCall is one transaction in a txnSender's lane, and its outcome.
type txnCall struct {
	key  string // the lock's key
	req  *etcdserverpb.TxnRequest
	resp *clientv3.TxnResponse
	err  error
}

// maxNested is the most transactions nested in one.
const maxNested = 32

func newTxnSender(cli *clientv3.Client, maxTxnOps int) *txnSender {
	s := &txnSender{cli: cli, direct: reflect.TypeOf(cli.KV) == reflect.TypeOf(clientv3.NewKV(cli)), maxTxnOps: maxTxnOps}
	if s.direct {
		// clientv3's KV passes the client's call options (wait for ready,
		// the message size limits of its Config) to every call: read them
		// from a KV of the same client whose remote only records them.
		rec := &callOptsRecorder{}
		_, _ = clientv3.NewKVFromKVClient(rec, cli).Txn(context.Background()).Commit()
		s.opts = rec.opts
		s.lane = lane.New(func(ctx context.Context, c *txnCall) { c.resp, c.err = s.sendOne(ctx, c.req) }, s.sendBatch)
	}
	return s
}

// callOptsRecorder is a KV service that answers a Txn call locally,
// recording its call options. Its other methods are not used.
type callOptsRecorder struct {
	etcdserverpb.KVClient
	opts []grpc.CallOption
}

func (r *callOptsRecorder) Txn(_ context.Context, _ *etcdserverpb.TxnRequest, opts ...grpc.CallOption) (*etcdserverpb.TxnResponse, error) {
	r.opts = opts
	return &etcdserverpb.TxnResponse{}, nil
}

// send sends transaction r, which writes only keys of the lock key (and
// its permits and queue); token is the owner token of a claim, else "".
// Its errors are clientv3's. An error of ctx's when r may have been sent
// leaves a release of token to wait for r's outcome (after).
func (s *txnSender) send(ctx context.Context, key, token string, r *etcdserverpb.TxnRequest) (*clientv3.TxnResponse, error) {
	if s.lane == nil {
		resp, err := s.cli.KV.Do(ctx, clientv3.OpTxn(cmpsOf(r.Compare), opsOf(r.Success), opsOf(r.Failure)))
		if err != nil {
			return nil, err
		}
		return resp.Txn(), nil
	}
	c := s.lane.Get()
	c.V.key, c.V.req = key, r
	if err := s.lane.Do(ctx, c, token, true); err != nil {
		if errors.Is(err, lane.ErrUnsent) {
			s.lane.Put(c)
			if token != "" {
				return nil, core.Unclaimed(ctx.Err()) // a claim that never left
			}
		}
		return nil, ctx.Err()
	}
	resp, err := c.V.resp, c.V.err
	s.lane.Put(c)
	return resp, err
}

// after waits until no claim of owner token whose caller left it is on
// its way (lane.Lane.After).
func (s *txnSender) after(ctx context.Context, token string) error {
	if s.lane == nil {
		return nil
	}
	if err := s.lane.After(ctx, token); err != nil {
		return fmt.Errorf("etcdlock: %w", err)
	}
	return nil
}

func (s *txnSender) close() {
	if s.lane != nil {
		s.lane.Close()
	}
}

// sendOne sends r on its own, with the KV service's Txn call.
func (s *txnSender) sendOne(ctx context.Context, r *etcdserverpb.TxnRequest) (*clientv3.TxnResponse, error) {
	resp, err := etcdserverpb.NewKVClient(s.cli.ActiveConnection()).Txn(ctx, r, s.opts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}

// sendBatch sends the transactions of calls nested in as few transactions
// as distinct keys and the server's limit of operations allow, one after
// another in the calls' order.
func (s *txnSender) sendBatch(ctx context.Context, calls []*lane.Call[txnCall]) {
	for len(calls) > 0 {
		var round, rest []*lane.Call[txnCall]
		keys := make(map[string]bool, len(calls))
		need := 0
		for _, c := range calls {
			n := max(need, opsNeeded(c.V.req))
			if keys[c.V.key] || len(round) == maxNested || len(round) > 0 && len(round)+1+n > s.maxTxnOps {
				rest = append(rest, c)
				continue
			}
			keys[c.V.key], need = true, n
			round = append(round, c)
		}
		s.sendNested(ctx, round)
		calls = rest
	}
}

// sendNested sends the transactions of calls as one. When the server
// refuses it whole, before it applies anything (a lease of one of them not
// found, say), each is sent on its own, so that each gets its own answer.
func (s *txnSender) sendNested(ctx context.Context, calls []*lane.Call[txnCall]) {
	if len(calls) == 1 {
		c := &calls[0].V
		c.resp, c.err = s.sendOne(ctx, c.req)
		return
	}
	ops := make([]*etcdserverpb.RequestOp, len(calls))
	for i, c := range calls {
		ops[i] = &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestTxn{RequestTxn: c.V.req}}
	}
	resp, err := s.sendOne(ctx, &etcdserverpb.TxnRequest{Success: ops})
	if err == nil && len(resp.Responses) != len(calls) {
		err = fmt.Errorf("etcdlock: %d answers to %d nested transactions", len(resp.Responses), len(calls))
	}
	switch {
	case err == nil:
		for i, c := range calls {
			sub := resp.Responses[i].GetResponseTxn()
			if sub == nil {
				c.V.err = errors.New("etcdlock: a nested transaction without its answer")
				continue
			}
			sub.Header = resp.Header // the nested answers carry none: theirs is the transaction's
			c.V.resp = (*clientv3.TxnResponse)(sub)
		}
	case refusedWhole(err):
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Go(func() { c.V.resp, c.V.err = s.sendOne(ctx, c.V.req) })
		}
		wg.Wait()
	default:
		for _, c := range calls {
			c.V.err = err
		}
	}
}

// refusedWhole reports whether err is the server's refusal of a whole
// transaction before anything of it was applied, for a reason that one of
// its nested transactions may have alone.
func refusedWhole(err error) bool {
	switch rpctypes.Error(err) {
	case rpctypes.ErrLeaseNotFound, rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge:
		return true
	}
	return false
}

// opsNeeded is how many operations of the server's limit (--max-txn-ops)
// r uses with the transactions nested in it: the server allows a nested
// transaction the limit less the operations of those around it.
func opsNeeded(r *etcdserverpb.TxnRequest) int {
	n := max(len(r.Compare), len(r.Success), len(r.Failure))
	inner := 0
	for _, ops := range [][]*etcdserverpb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if t := op.GetRequestTxn(); t != nil {
				inner = max(inner, opsNeeded(t))
			}
		}
	}
	return n + inner
}

// claimKeys are the etcd keys a claim's transaction names, sliced from
// one array: the lock key k, the bounds of its permit range (lo is also
// where that range starts after k) and of its queue.
type claimKeys struct{ k, lo, hi, qlo, qhi []byte }

// claimKeys returns the keys of etcdKey(key), permitRange(key) and
// queueRange(key).
func (b *Backend) claimKeys(key string) claimKeys {
	p, n := b.prefix, len(b.prefix)+len(key)
	q := n + len(queueMark) + 1
	buf := make([]byte, 0, 2*(n+1)+2*q)
	buf = append(append(append(buf, p...), key...), 0)
	buf = append(append(append(buf, p...), key...), 1)
	buf = append(append(append(append(buf, p...), queueMark...), key...), 0)
	buf = append(append(append(append(buf, p...), queueMark...), key...), 1)
	lo, hi := buf[:n+1:n+1], buf[n+1:2*n+2:2*n+2]
	qlo, qhi := buf[2*n+2:2*n+2+q:2*n+2+q], buf[2*n+2+q:]
	return claimKeys{k: lo[:n:n], lo: lo, hi: hi, qlo: qlo, qhi: qhi}
}

// cmpsOf and opsOf turn the protobuf compares and operations of the
// transactions built here back into clientv3's, for a client's own KV.
func cmpsOf(cs []*etcdserverpb.Compare) []clientv3.Cmp {
	out := make([]clientv3.Cmp, len(cs))
	for i, c := range cs {
		out[i] = clientv3.FromCompare(c)
	}
	return out
}

func opsOf(rs []*etcdserverpb.RequestOp) []clientv3.Op {
	out := make([]clientv3.Op, len(rs))
	for i, r := range rs {
		switch {
		case r.GetRequestRange() != nil:
			rr := r.GetRequestRange()
			var opts []clientv3.OpOption
			if len(rr.RangeEnd) > 0 {
				opts = append(opts, clientv3.WithRange(string(rr.RangeEnd)))
			}
			if rr.SortOrder != etcdserverpb.RangeRequest_NONE {
				opts = append(opts, clientv3.WithSort(clientv3.SortTarget(rr.SortTarget), clientv3.SortOrder(rr.SortOrder)))
			}
			if rr.KeysOnly {
				opts = append(opts, clientv3.WithKeysOnly())
			}
			out[i] = clientv3.OpGet(string(rr.Key), opts...)
		case r.GetRequestPut() != nil:
			p := r.GetRequestPut()
			out[i] = clientv3.OpPut(string(p.Key), string(p.Value), clientv3.WithLease(clientv3.LeaseID(p.Lease)))
		case r.GetRequestDeleteRange() != nil:
			d := r.GetRequestDeleteRange()
			var opts []clientv3.OpOption
			if len(d.RangeEnd) > 0 {
				opts = append(opts, clientv3.WithRange(string(d.RangeEnd)))
			}
			out[i] = clientv3.OpDelete(string(d.Key), opts...)
		case r.GetRequestTxn() != nil:
			t := r.GetRequestTxn()
			out[i] = clientv3.OpTxn(cmpsOf(t.Compare), opsOf(t.Success), opsOf(t.Failure))
		}
	}
	return out
}

// compare is the compare of key (with end, of every key in [key, end)) by
// target, one of the revisions or the lease, against v.
func compare(target etcdserverpb.Compare_CompareTarget, key, end []byte, result etcdserverpb.Compare_CompareResult, v int64) *etcdserverpb.Compare {
	c := &etcdserverpb.Compare{Target: target, Result: result, Key: key, RangeEnd: end}
	switch target {
	case etcdserverpb.Compare_CREATE:
		c.TargetUnion = &etcdserverpb.Compare_CreateRevision{CreateRevision: v}
	case etcdserverpb.Compare_MOD:
		c.TargetUnion = &etcdserverpb.Compare_ModRevision{ModRevision: v}
	case etcdserverpb.Compare_LEASE:
		c.TargetUnion = &etcdserverpb.Compare_Lease{Lease: v}
	default:
		panic("etcdlock: no compare of target " + target.String())
	}
	return c
}

// The helpers below take keys as bytes, which the messages hold: keys
// sliced from one array (claimKeys) cost no copy each. Nothing writes to
// a message's bytes once it is built.

// opPut puts key with value bound to lease.
func opPut(key, value []byte, lease int64) *etcdserverpb.RequestOp {
	return &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestPut{RequestPut: &etcdserverpb.PutRequest{Key: key, Value: value, Lease: lease}}}
}

// opDelete deletes key.
func opDelete(key []byte) *etcdserverpb.RequestOp {
	return &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestDeleteRange{RequestDeleteRange: &etcdserverpb.DeleteRangeRequest{Key: key}}}
}

// opGet reads key, or with end the keys in [key, end) oldest first (by
// create revision), their keys only with keysOnly.
func opGet(key, end []byte, keysOnly bool) *etcdserverpb.RequestOp {
	r := &etcdserverpb.RangeRequest{Key: key, KeysOnly: keysOnly}
	if end != nil {
		r.RangeEnd = end
		r.SortOrder, r.SortTarget = etcdserverpb.RangeRequest_ASCEND, etcdserverpb.RangeRequest_CREATE
	}
	return &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestRange{RequestRange: r}}
}

// opTxn is a nested transaction.
func opTxn(cmps []*etcdserverpb.Compare, then, els []*etcdserverpb.RequestOp) *etcdserverpb.RequestOp {
	return &etcdserverpb.RequestOp{Request: &etcdserverpb.RequestOp_RequestTxn{RequestTxn: &etcdserverpb.TxnRequest{Compare: cmps, Success: then, Failure: els}}}
}
