// Package state lets the tests of etcdlock's nested module see state of a
// Backend that the package does not export. etcdlock sets its functions.
package state

var (
	// Lane reports, for an *etcdlock.Backend, how many senders of its
	// lane are at work, how many calls are queued and how many owner
	// tokens have claims on their way whose callers left them.
	Lane func(backend any) (busy, queued, pending int)
	// FirstWaiter reports the first waiter in key's line that the
	// Backend's watch knows, with a grant record (grant.go).
	FirstWaiter func(backend any, key string) (waiter string, ok bool)
	// DropPlace forgets the Backend's waiter on key without deleting its
	// waiter key, as a waiter that stopped waiting while its Leave is on
	// its way.
	DropPlace func(backend any, key, waiter string)
)
