// Package ownclient builds the core.Client of a backend constructor that
// made its Backend itself (the SQL backends' Open and New).
package ownclient

import "github.com/dislock/dislock/core"

// New returns core.New over b with opts, closing b when core.New refuses
// the options.
func New(b core.Backend, opts []core.ClientOption) (*core.Client, error) {
	c, err := core.New(b, opts...)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}
