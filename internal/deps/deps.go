package deps

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/go-co-op/gocron/v2"
	_ "github.com/hibiken/asynq"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/redis/go-redis/v9"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	_ "go.opentelemetry.io/otel/sdk/metric"
	_ "go.opentelemetry.io/otel/sdk/trace"
	_ "go.uber.org/goleak"
)
