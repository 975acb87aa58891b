package sqlbackend

import (
	"strconv"
	"testing"
)

// A full Keys drops its stale entries before it takes a new one, and all
// of them when none is stale; CompareAndDelete forgets only a matching value.
func TestKeysBounded(t *testing.T) {
	var k Keys[int]
	for i := range MaxKeys {
		k.Put(strconv.Itoa(i), i, nil)
	}
	k.Put("new", -1, func(v int) bool { return v%2 == 0 })
	if _, ok := k.Get("0"); ok {
		t.Error("a stale entry survived a Put into a full Keys")
	}
	if v, ok := k.Get("1"); !ok || v != 1 {
		t.Errorf("an entry that is not stale: %v, %v; want 1, true", v, ok)
	}
	for i := range MaxKeys {
		k.Put("more"+strconv.Itoa(i), 1, nil)
	}
	if _, ok := k.Get("new"); ok {
		t.Error("a full Keys with nothing stale kept its entries")
	}
	var c Keys[int]
	c.Put("k", 1, nil)
	if c.CompareAndDelete("k", 2) || !c.CompareAndDelete("k", 1) || c.CompareAndDelete("k", 1) {
		t.Error("CompareAndDelete deletes only a present, matching value")
	}
}
