package zklock

import "time"

// ClaimData is the data of a claim node, for tests that write one by hand.
func ClaimData(ttl time.Duration, owner string) []byte { return claimData(ttl, owner) }

// EncodeName and DecodeName expose the key encoding.
var (
	EncodeName = encodeName
	DecodeName = decodeName
)
