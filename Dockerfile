# docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t sluice .
# docker run --rm sluice --version

# The builder runs on the build machine's platform and cross-compiles, so a
# multi-platform build (docker buildx --platform linux/amd64,linux/arm64)
# needs no emulation: the binary is pure Go.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice
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
ENTRYPOINT ["/sluice"]
# Protected mode refuses to listen on a non-loopback address without a
# password: pass one with SLUICE_REQUIREPASS_FILE (or SLUICE_REQUIREPASS).
CMD ["--addr", ":9049", "--http-addr", ":9050", "--data", "/data", "--backup-dir", "/data/backups", "--protected-mode", "yes"]
