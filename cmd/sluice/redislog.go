package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisLogger writes go-redis's log lines as warnings of a slog.Logger.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// setRedisLogger makes l go-redis's logger, for the whole process.
func setRedisLogger(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }
