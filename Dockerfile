# docker build --build-arg VERSION="$(git describe --tags --match 'v[0-9]*' --always --dirty)" \
#   --build-arg REVISION="$(git rev-parse HEAD)" -t sluice .
# docker run --rm sluice --version

# The builder runs on the build machine's platform and cross-compiles, so a
# multi-platform build (docker buildx --platform linux/amd64,linux/arm64)
# needs no emulation: the binary is pure Go.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# go.work builds the server with the client module of this checkout (the
# server uses two of its standard-library-only packages) rather than the
# released version go.mod requires, so both modules' files are needed to
# download.
COPY go.mod go.sum go.work go.work.sum ./
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
# The context has no .git, so Go cannot record the commit: pass it.
ARG REVISION=
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/sluice ./cmd/sluice
# An empty directory, copied below as /data so that it belongs to the
# non-root user: a fresh Docker volume takes the ownership of the image's
# directory, and sluice must be able to write there.
RUN mkdir /out/data

# distroless/static rather than scratch: it ships /etc/passwd with the
# nonroot user (65532), /tmp, CA certificates and time zones, and nothing
# else (no shell, no package manager), and it is maintained and rebuilt for
# security fixes. With scratch we would have to build those files ourselves.
# Pin it by digest (@sha256:...) in a release pipeline.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /sluice
COPY --from=build --chown=65532:65532 /out/data /data
# Numeric, so that Kubernetes can check runAsNonRoot without /etc/passwd.
USER 65532:65532
VOLUME /data
# 9049: RESP. 9050: HTTP /metrics, /healthz, /readyz.
EXPOSE 9049 9050
# The defaults are variables, not a CMD: arguments after the image name
# (docker run sluice --fsync always) replace the CMD, and would lose them;
# they add to the variables instead, and a flag wins over its variable.
# Listening on every interface, protected mode refuses clients that are not
# on loopback until there is a password or client certificates: pass one
# with SLUICE_REQUIREPASS_FILE (or SLUICE_REQUIREPASS).
# The volume holds the store in /data/store and checkpoints in
# /data/backups: on one filesystem, so that a checkpoint hard-links the
# store's files, and apart, as sluice refuses checkpoints inside the store.
# A volume of an older image, with the store's files directly in /data, is
# moved into /data/store at the first start (SLUICE_MOVE_STORE_FROM).
ENV SLUICE_ADDR=:9049 \
    SLUICE_HTTP_ADDR=:9050 \
    SLUICE_DATA=/data/store \
    SLUICE_BACKUP_DIR=/data/backups \
    SLUICE_MOVE_STORE_FROM=/data \
    SLUICE_PROTECTED_MODE=yes
ENTRYPOINT ["/sluice"]
# No shell or curl here: the binary checks itself. sluice health reads the
# same variables (address, password, TLS) and GETs /readyz. The start
# period covers replaying a long log after a crash.
HEALTHCHECK --interval=10s --timeout=10s --start-period=5m --retries=3 \
    CMD ["/sluice", "health"]
