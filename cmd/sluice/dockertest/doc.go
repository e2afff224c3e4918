// Package dockertest runs the sluice daemon as a real cluster of Docker
// containers and holds only tests; it has no API.
//
// Each container is a host of its own with its own address on a private
// Docker network: the tests build cmd/sluice as a static binary
// (CGO_ENABLED=0), put it in an image made of deploy/Dockerfile's final
// stage, FROM scratch (no image is pulled, so no registry is needed),
// create a network, start three containers running `sluice serve` with
// gossip, the public gRPC API, the peers' gRPC port (peer_addr) and HTTP
// bound inside the container, and talk to the daemons only through their
// HTTP ports, published on 127.0.0.1. They kill
// a container with `docker kill` and cut one off with `docker network
// disconnect`, and check that the limit stays exact, that the others keep
// answering, and that the cluster converges again. One test joins the
// containers through a network alias that all of them carry, which
// Docker's DNS answers with every address, as Kubernetes does a headless
// Service's name (deploy/kubernetes).
//
// The tests skip when the docker command is missing or `docker info`
// fails, so `go test ./...` passes without Docker. Every container,
// network and image they create carries the label sluice-dockertest and is
// removed when the tests end; after a test binary that was killed,
//
//	docker rm -f $(docker ps -aq --filter label=sluice-dockertest)
//	docker network prune --filter label=sluice-dockertest
//	docker image prune --filter label=sluice-dockertest
//
// removes what is left.
package dockertest
