# syntax=docker/dockerfile:1
# The Astraeus server image: `docker compose up` (see docker-compose.yml).

# The console, built to web/dist and embedded by the release build.
FROM node:20-bookworm AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web/ ./
RUN npm run build

FROM rust:1-bookworm AS builder
WORKDIR /src
# Queries are checked against .sqlx/ when it exists, never against a live database.
ENV SQLX_OFFLINE=true
COPY . .
COPY --from=web /web/dist web/dist
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin astraeus \
    && cp target/release/astraeus /usr/local/bin/astraeus

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --user-group --create-home --home-dir /var/lib/astraeus astraeus \
    && install -d -o astraeus -g astraeus -m 0700 /keys
COPY --from=builder /usr/local/bin/astraeus /usr/local/bin/astraeus
USER astraeus
WORKDIR /var/lib/astraeus
ENV ASTRAEUS_LISTEN=0.0.0.0:8080 \
    ASTRAEUS_SIGNING_KEY_FILE=/keys/signing-key.pem \
    ASTRAEUS_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["astraeus"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
