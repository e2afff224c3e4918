// Package redistest runs the sluice daemon with backend redis as real
// processes and holds only tests; it has no API.
//
// The tests build cmd/sluice once, start three `sluice serve --backend
// redis` processes on loopback ports against one Redis deployment that
// they start with package testredis (a 3-master Redis Cluster, a
// standalone server that requires AUTH, a standalone server that speaks
// TLS alone), and send checks of one key from 64 callers spread over the
// three daemons, over HTTP and gRPC: every algorithm admits exactly its
// limit. They kill one daemon hard under traffic and start it again: the
// count, in Redis, loses nothing; and daemons whose callers disagree on a
// key's limit share one count. They skip when redis-server or
// redis-cli is missing.
package redistest
