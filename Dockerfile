# syntax=docker/dockerfile:1
#
# The outboxd image docs/deploy/kubernetes.yaml runs. The binary is built
# by `make build`, the same target developers and the tests use, with cgo
# off so it is static; the final image holds that binary, CA certificates
# and time zones, no shell, and runs as the unprivileged user 65532.
#
#   docker build -t registry.example.com/outboxd:1.0.0 \
#     --build-arg VERSION="$(git describe --always --dirty)" \
#     --build-arg COMMIT="$(git rev-parse HEAD)" .
#
# .git stays out of the build context (.dockerignore), so VERSION and COMMIT
# come in as build arguments; without them `outboxd version` says devel.
# scripts/check-dockerfile (run by `make vet`) keeps this file in step with
# the Makefile, go.mod and the deployment files.

# The Go release of go.mod's go line.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=
ARG COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=0 make build VERSION="$VERSION" COMMIT="$COMMIT"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/bin/outboxd /outboxd
USER 65532:65532
# The admin server (dashboard, /metrics, /healthz, /readyz) when started
# with --admin-addr=0.0.0.0:9464.
EXPOSE 9464
ENTRYPOINT ["/outboxd"]
CMD ["relay"]
