// Package lanestate lets the tests of etcdlock's nested module see the
// state of a Backend's lane (internal/lane), which the package does not
// export.
package lanestate

// Of reports, for an *etcdlock.Backend, how many senders of its lane are
// at work, how many calls are queued and how many owner tokens have claims
// on their way whose callers left them. etcdlock sets it.
var Of func(backend any) (busy, queued, pending int)
