package redislock

import (
	"strconv"
	"testing"
)

func TestKnownTokens(t *testing.T) {
	var k knownTokens
	k.put("a", "t1", 7)
	if tok, ok := k.take("a", "t1"); !ok || tok != 7 {
		t.Fatalf("take = %d %v", tok, ok)
	}
	if _, ok := k.take("a", "t1"); ok {
		t.Fatal("taken twice")
	}
	k.put("a", "t2", 8)
	k.drop("a", "t2")
	if _, ok := k.take("a", "t2"); ok {
		t.Fatal("dropped token still known")
	}
	for i := range maxKnownTokens + 10 {
		k.put("k", strconv.Itoa(i), uint64(i))
	}
	if len(k.m) != maxKnownTokens {
		t.Fatalf("%d known tokens, bound %d", len(k.m), maxKnownTokens)
	}
}
