#!/bin/sh
# Generate the demo stack's keys (compose/keys/, mode 0600, never committed) and render its
# configs (compose/generated/). Run once before `docker compose up`.
#
#   compose/gen-keys.sh            inside the raven image (needs only Docker); the key files
#                                  are owned by uid 10001, the user the containers run as
#   compose/gen-keys.sh --local    with this checkout's Python (needs `cryptography`); then
#                                  start the stack with RAVEN_UID=$(id -u) RAVEN_GID=$(id -g)
#
# Extra arguments go to compose/gen_keys.py (--force renews the keys).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--local" ]; then
    shift
    exec "${PYTHON:-python3}" compose/gen_keys.py --dir compose "$@"
fi
docker compose build keygen
exec docker compose --profile setup run --rm keygen "$@"
