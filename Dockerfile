# keyway: one static binary for the proxy, the agent, the CLI and the demo replica.
#   make docker          # = docker build --build-arg VERSION=... --build-arg COMMIT=... --build-arg DATE=... -t keyway:VERSION .
#   docker build -t keyway .                # works too; `keyway version` then says "dev", commit unknown
#   docker run --rm -p 8080:8080 keyway demo --listen :8080   # the admin API stays on loopback
# The runtime image is Alpine rather than distroless so that a replica container's
# preStop hook can wait for its agent with sh and wget (deploy/kubernetes/orders.yaml).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build context has no .git (.dockerignore): the version, commit and
# date come in as build arguments and are stamped like `make build` does
# (keyway version, keyway_build_info).
ARG VERSION=dev
ARG COMMIT=
ARG DATE=
RUN CGO_ENABLED=0 go build -trimpath -o /out/keyway \
    -ldflags "-s -w -X keyway/internal/buildinfo.version=${VERSION} -X keyway/internal/buildinfo.commit=${COMMIT} -X keyway/internal/buildinfo.date=${DATE}" \
    ./cmd/keyway

FROM alpine:3.20
ARG VERSION=dev
ARG COMMIT=
LABEL org.opencontainers.image.title=keyway org.opencontainers.image.version=${VERSION} org.opencontainers.image.revision=${COMMIT}
RUN adduser -D -H -u 65532 keyway
COPY --from=build /out/keyway /usr/local/bin/keyway
# Keeps the Go runtime's monitor thread out of deep sleep (docs/proxy.md, "The
# runtime's monitor thread"); set in the image, `keyway proxy` need not
# re-execute itself at start to set it.
ENV GODEBUG=schedtrace=2147483647
USER 65532:65532
EXPOSE 8080 9901 7946/tcp 7946/udp
ENTRYPOINT ["keyway"]
CMD ["help"]
