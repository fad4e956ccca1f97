# keyway: one static binary for the proxy, the agent, the CLI and the demo replica.
#   docker build -t keyway .
#   docker run --rm -p 8080:8080 keyway demo --listen :8080   # the admin API stays on loopback
# The runtime image is Alpine rather than distroless so that a replica container's
# preStop hook can wait for its agent with sh and wget (deploy/kubernetes/orders.yaml).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/keyway ./cmd/keyway

FROM alpine:3.20
RUN adduser -D -H -u 65532 keyway
COPY --from=build /out/keyway /usr/local/bin/keyway
USER 65532:65532
EXPOSE 8080 9901 7946/tcp 7946/udp
ENTRYPOINT ["keyway"]
CMD ["help"]
