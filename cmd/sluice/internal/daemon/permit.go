package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// Who may use the destructive behaviors: reset clears a key's counter,
// drain_over_limit empties its bucket and refund gives hits back, so a
// caller with any of them can undo any limit. Config.Destructive says who
// may.
const (
	// DestructiveAllow lets every caller of the API use them.
	DestructiveAllow = "allow"
	// DestructiveDeny refuses them to every caller.
	DestructiveDeny = "deny"
	// DestructiveAdmins lets only callers whose verified client
	// certificate names one of Config.AdminIdentities use them.
	DestructiveAdmins = "admins"
)

// destructive is the behaviors Config.Destructive restricts. A public
// caller's refund cannot be bounded to hits that caller took (the daemon
// does not know who took them), so it is one of them.
const destructive = limiter.Reset | limiter.DrainOverLimit | limiter.Refund

// errDestructive is a request refused by Config.Destructive.
var errDestructive = errors.New("reset, drain_over_limit and refund are not permitted to this caller (destructive_behaviors)")

// serverNamePrefix begins the limiter Name of every counter that the
// daemon's server-side limits own: "@" and the rule's name for a rule of
// Config.RulesFile, "@envoy/<unit>" for Envoy's rate limit service. A rule
// name holds no '/' (rules.MaxNameLen leaves room for the prefix), so the
// two never meet. Checks that carry their own limits (POST /v1/check and
// its batch, the gRPC Sluice service, package client) may not name them,
// so that no caller can spend, peek or switch the algorithm of a counter
// whose limit the server sets; the admin API inspects them, and resets
// them under Config.Destructive, by their full names.
const serverNamePrefix = "@"

// errServerName is a public check that names a server-side counter.
var errServerName = errors.New(`names beginning with "` + serverNamePrefix + `" are the counters of rules_file and envoy_config_dir, which checks carrying their own limits may not reach`)

// permit refuses req when it asks for a destructive behavior that the
// caller, whose verified client certificate is cert (nil for none), may
// not use, or when it names a server-side counter (serverNamePrefix)
// other than to reset it.
func (d *Daemon) permit(cert *x509.Certificate, req *limiter.Request) error {
	if strings.HasPrefix(req.Name, serverNamePrefix) && (req.Hits != 0 || req.Behavior != limiter.Reset) {
		return errServerName
	}
	if req.Behavior&destructive == 0 {
		return nil
	}
	switch d.cfg.Destructive {
	case DestructiveAllow, "":
		return nil
	case DestructiveAdmins:
		if cert != nil && transport.HasIdentity(cert, d.cfg.AdminIdentities) {
			return nil
		}
	}
	return errDestructive
}

// permitGRPC is permit for a caller of the public gRPC API.
func (d *Daemon) permitGRPC(ctx context.Context, req *limiter.Request) error {
	return d.permit(transport.CallerCertificate(ctx), req)
}

// permitHTTP is permit for a caller of the HTTP API.
func (d *Daemon) permitHTTP(r *http.Request, req *limiter.Request) error {
	return d.permit(callerCert(r), req)
}

// callerCert returns the verified client certificate of r, or nil.
func callerCert(r *http.Request) *x509.Certificate {
	if r.TLS == nil {
		return nil
	}
	return transport.VerifiedLeaf(r.TLS.VerifiedChains)
}

// maxSecretFile bounds the cluster secret file.
const maxSecretFile = 4 << 10

// readClusterSecret reads the cluster secret from path, without the
// white space around it.
func readClusterSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("%s is more than %d bytes", path, maxSecretFile)
	}
	s := strings.TrimSpace(string(b))
	if len(s) < transport.MinClusterSecretLen {
		return nil, fmt.Errorf("%s holds %d bytes of secret, want at least %d", path, len(s), transport.MinClusterSecretLen)
	}
	return []byte(s), nil
}
