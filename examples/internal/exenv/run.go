package exenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
)

// Main is an example program's main: it calls run with a context that ends
// on an interrupt and with standard output, and on an error prints it after
// name and exits with status 1.
func Main(name string, run func(ctx context.Context, out io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Printer writes whole lines to W from many goroutines at once.
type Printer struct {
	mu sync.Mutex
	W  io.Writer
}

// Printf is fmt.Fprintf to W, one call at a time.
func (p *Printer) Printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.W, format, args...)
}
