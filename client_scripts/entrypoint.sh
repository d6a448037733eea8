#!/bin/sh
set -eu
if [ -n "${JUPYTER_TOKEN_FILE:-}" ]; then
    JUPYTER_TOKEN="$(cat "$JUPYTER_TOKEN_FILE")"
fi
if [ -z "${TRITON_URL:-}" ]; then
    echo "error: set TRITON_URL to Triton's host:port as this container reaches it (not localhost)" >&2
    exit 2
fi
if [ -z "${JUPYTER_TOKEN:-}" ]; then
    echo "error: set JUPYTER_TOKEN (or JUPYTER_TOKEN_FILE): Jupyter never runs without a token" >&2
    exit 2
fi
case "$TRITON_URL" in
    localhost*|127.*) echo "warning: TRITON_URL=$TRITON_URL is this container itself (fine only with --network host)" >&2 ;;
esac
export JUPYTER_TOKEN TRITON_URL
uvicorn api:app --app-dir /app/client_scripts --host 0.0.0.0 --port "${API_PORT:-8080}" &
api=$!
# Jupyter reads its token from JUPYTER_TOKEN (so it is not on a command line `ps` shows).
# compose.yaml runs the container as the host's login user; where that is root
# (a host one logs into as root), Jupyter needs to be told that this is meant.
allow_root=""
if [ "$(id -u)" = 0 ]; then allow_root="--allow-root"; fi
jupyter lab --ip=0.0.0.0 --port="${JUPYTER_PORT:-8888}" --no-browser --ServerApp.root_dir=/app --ServerApp.allow_remote_access=True $allow_root &
jupyter=$!
trap 'kill "$api" "$jupyter" 2>/dev/null' INT TERM
# POSIX sh has no `wait -n`: poll until one of the two has gone, then stop the other.
while kill -0 "$api" 2>/dev/null && kill -0 "$jupyter" 2>/dev/null; do sleep 2; done
kill "$api" "$jupyter" 2>/dev/null || true
wait
