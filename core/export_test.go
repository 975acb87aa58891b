package core

// EchoCount reports how many own-release echoes c remembers.
func EchoCount(c *Client) int { return c.echoCount() }
