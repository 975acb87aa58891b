package etcdtest

import (
	"context"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// Counter counts what the etcd clients it is dialled into send: unary
// calls, streams opened, and messages sent on open streams (lease
// keepalives, watch requests); and the watches their server confirmed
// (a watch response marked Created). Add DialOptions to a client's config.
type Counter struct {
	Unary, Streams, StreamMsgs atomic.Int64
	Watches                    atomic.Int64
}

// Requests is the unary calls and the streams opened so far.
func (c *Counter) Requests() int64 { return c.Unary.Load() + c.Streams.Load() }

// All is everything sent so far: Requests and the messages on streams.
func (c *Counter) All() int64 { return c.Requests() + c.StreamMsgs.Load() }

// DialOptions are the gRPC interceptors that count.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.Unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.Streams.Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &countingStream{ClientStream: s, c: c}, nil
		}),
	}
}

type countingStream struct {
	grpc.ClientStream
	c *Counter
}

func (s *countingStream) SendMsg(m any) error {
	s.c.StreamMsgs.Add(1)
	return s.ClientStream.SendMsg(m)
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if w, ok := m.(*etcdserverpb.WatchResponse); ok && err == nil && w.Created {
		s.c.Watches.Add(1)
	}
	return err
}
