package zklock

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// Layout under the root (default "/dislock"):
//
//	<root>/locks/<enc(key)>                       container node, one per key
//	<root>/locks/<enc(key)>/l-<enc(token)>-NNNNNNNNNN   ephemeral sequential: a claim
//	<root>/locks/<enc(key)>/h-<untilMs>-<enc(token)>    persistent: a hold (min hold, slot)
//	<root>/locks/<enc(key)>/p-<limit>-<enc(token)>-NNNNNNNNNN   ephemeral sequential: a permit claim
//	<root>/locks/<enc(key)>/q-<limit>-<untilMs>-<enc(token)>    persistent: a permit's hold
//	<root>/clock                                  persistent: Now writes it and reads its mtime
//
// A claim's data is "1\n<ttl ms>\n<owner>"; it is in force until its mtime
// (the server time of its creation or last renewal) plus the TTL. A hold's
// data is "1\n<fencing token>\n<owner>"; it is in force until untilMs, which
// is on the server clock. Permit claims and holds (semaphores, Limit > 1)
// are the same with the semaphore's limit in their names.
//
// A waiting Acquire (core.Queuer) keeps its place in line as a claim node
// named by its Waiter instead of an owner token, with the data
// "2\n0\n<owner>" while it waits: live while its session is, never judged
// by a TTL; the backend that made it deletes it when the wait leaves or its
// WaiterTTL runs out unrefreshed. The grant rewrites it as a claim
// ("1\n<ttl ms>\n<owner>"), which starts the lease on the server's clock.
// The lowest nodes hold: a claim is granted when fewer nodes in force are
// below it, with the holds, than the key has permits (one for a mutex).

const (
	claimPrefix      = "l-"
	holdPrefix       = "h-"
	permitPrefix     = "p-"
	permitHoldPrefix = "q-"
	seqLen           = 10 // ZooKeeper's sequence suffix: %010d
)

// encodeName makes s a valid ZooKeeper path component that decodeName
// reverses: every byte outside [A-Za-z0-9_~-] becomes %XX. "." and ".."
// cannot result, and "/" never appears.
func encodeName(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '~', c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// decodeName reverses encodeName.
func decodeName(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), nil
}

// child is a parsed child name of a key node.
type child struct {
	name  string
	hold  bool
	limit int    // permits and their holds: the semaphore's limit; 0 for a mutex
	token string // encoded owner token
	seq   int64  // claims
	until int64  // holds: ms since the epoch, server clock
}

func parseChild(name string) (child, bool) {
	c := child{name: name}
	var rest string
	switch {
	case strings.HasPrefix(name, permitPrefix), strings.HasPrefix(name, permitHoldPrefix):
		// <limit>- then the rest as for a claim or a hold.
		rest = name[len(permitPrefix):]
		i := strings.IndexByte(rest, '-')
		if i <= 0 {
			return c, false
		}
		limit, err := strconv.Atoi(rest[:i])
		if err != nil || limit < 2 {
			return c, false
		}
		kind := claimPrefix
		if name[0] == permitHoldPrefix[0] {
			kind = holdPrefix
		}
		p, ok := parseChild(kind + rest[i+1:])
		if !ok {
			return c, false
		}
		p.name, p.limit = name, limit
		return p, true
	case strings.HasPrefix(name, claimPrefix):
		rest = name[len(claimPrefix):]
		if len(rest) < seqLen+2 || rest[len(rest)-seqLen-1] != '-' {
			return c, false
		}
		seq, err := strconv.ParseInt(rest[len(rest)-seqLen:], 10, 64)
		if err != nil {
			return c, false
		}
		c.seq, c.token = seq, rest[:len(rest)-seqLen-1]
		return c, true
	case strings.HasPrefix(name, holdPrefix):
		rest = name[len(holdPrefix):]
		i := strings.IndexByte(rest, '-')
		if i <= 0 || i == len(rest)-1 {
			return c, false
		}
		until, err := strconv.ParseInt(rest[:i], 10, 64)
		if err != nil {
			return c, false
		}
		c.hold, c.until, c.token = true, until, rest[i+1:]
		return c, true
	}
	return c, false
}

// holdName is the name of a hold; limit > 1: of a permit's hold.
func holdName(until int64, encToken string, limit int) string {
	if limit > 1 {
		return permitHoldPrefix + strconv.Itoa(limit) + "-" + strconv.FormatInt(until, 10) + "-" + encToken
	}
	return holdPrefix + strconv.FormatInt(until, 10) + "-" + encToken
}

// claimName is the name of a claim before its sequence number; limit > 1:
// of a permit claim.
func claimName(encToken string, limit int) string {
	if limit > 1 {
		return permitPrefix + strconv.Itoa(limit) + "-" + encToken + "-"
	}
	return claimPrefix + encToken + "-"
}

// claimData is the data of a claim node.
func claimData(ttl time.Duration, owner string) []byte {
	ms := ttl.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return []byte("1\n" + strconv.FormatInt(ms, 10) + "\n" + owner)
}

// holdData is the data of a hold node.
func holdData(token uint64, owner string) []byte {
	return []byte("1\n" + strconv.FormatUint(token, 10) + "\n" + owner)
}

// grantData is the data a semaphore's permit is granted with after its
// claim was made (a waiter's place, or a claim judged after another grant):
// its fencing token is the zxid of that write (its mzxid until its first
// renewal), so that permit tokens increase in the order of the grants,
// which waiters may take out of line order.
func grantData(ttl time.Duration, owner string) []byte {
	return append([]byte("1g"), claimData(ttl, owner)[1:]...)
}

// tokenData is the data a renewal writes to a permit granted so: the
// token itself.
func tokenData(ttl time.Duration, token uint64, owner string) []byte {
	return append([]byte("1t"+strconv.FormatUint(token, 10)), claimData(ttl, owner)[1:]...)
}

// ClaimToken is the fencing token of the claim node whose data and stat
// these are: its czxid, or, for a permit granted after its claim, the zxid
// of its grant (see grantData). For operators and tests.
func ClaimToken(data []byte, st *zk.Stat) uint64 {
	first, _, _ := strings.Cut(string(data), "\n")
	switch {
	case first == "1g":
		return uint64(st.Mzxid)
	case strings.HasPrefix(first, "1t"):
		if t, err := strconv.ParseUint(first[2:], 10, 64); err == nil {
			return t
		}
	}
	return uint64(st.Czxid)
}

// waitData is the data of a waiting place in line.
func waitData(owner string, minHold time.Duration) []byte {
	if minHold <= 0 {
		return []byte("2\n" + neverKept + "\n" + owner)
	}
	return []byte("2\n0\n" + owner)
}

// neverKept marks the data of a waiting place whose holder's release never
// keeps the lock (no min hold): its deletion after its grant frees the key
// at once, with no hold left behind. A place written without it ("0", as
// older versions write every place) may be kept.
const neverKept = "n"

// isNeverKept reports whether b is the data of a waiting place that is
// never kept.
func isNeverKept(b []byte) bool { return string(b[:min(len(b), 4)]) == "2\n"+neverKept+"\n" }

// isWaitData reports whether b is the data of a waiting place.
func isWaitData(b []byte) bool { return len(b) >= 2 && b[0] == '2' && b[1] == '\n' }

var errBadData = errors.New("zklock: node data not written by zklock")

// parseData reads either format: the number and the owner.
func parseData(b []byte) (n int64, owner string, err error) {
	parts := strings.SplitN(string(b), "\n", 3)
	if len(parts) != 3 || (parts[0] != "1" && parts[0] != "1g" && !strings.HasPrefix(parts[0], "1t")) {
		return 0, "", errBadData
	}
	n, err = strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return 0, "", errBadData
	}
	return n, parts[2], nil
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms) }

// isHold reports whether p is the path of a hold node.
func isHold(p string) bool {
	c, ok := parseChild(path.Base(p))
	return ok && c.hold
}
