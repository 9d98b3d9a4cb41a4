#!/bin/sh
# HEALTHCHECK of the Tollgate images: healthy when an HTTP GET of URL gets a status below 500.
#   healthcheck.sh [URL]      (default: $TOLLGATE_HEALTHCHECK_URL)
# Plain http://HOST:PORT/PATH only. Uses the first client the image has: BusyBox/GNU wget
# (Alpine), curl, or bash's /dev/tcp (Debian and Ubuntu slim images ship neither wget nor curl),
# so no image installs an HTTP client just for this.
set -eu
url=${1:-${TOLLGATE_HEALTHCHECK_URL:?no URL given and TOLLGATE_HEALTHCHECK_URL unset}}
rest=${url#http://}
hostport=${rest%%/*}
path=/${rest#"$hostport"}; path=/${path#/}
host=${hostport%:*}
port=${hostport##*:}
[ "$port" != "$hostport" ] || port=80

if command -v curl >/dev/null 2>&1; then
  status=$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$url" || true)
elif command -v wget >/dev/null 2>&1; then
  # wget exits non-zero on 4xx/5xx; the status line is in its -S output either way.
  status=$(wget -S -q -O /dev/null -T 3 "$url" 2>&1 | sed -n 's/^ *HTTP\/[0-9.]* \([0-9][0-9][0-9]\).*/\1/p' | tail -n 1)
else
  status=$(HC_HOST=$host HC_PORT=$port HC_PATH=$path bash -c '
    exec 3<>"/dev/tcp/$HC_HOST/$HC_PORT" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$HC_PATH" "$HC_HOST" >&3
    IFS=" " read -r _ code _ <&3 && printf %s "$code"' 2>/dev/null || true)
fi
case "$status" in
  [1-4][0-9][0-9]) exit 0 ;;
  *) echo "unhealthy: GET $url answered '${status:-nothing}'" >&2; exit 1 ;;
esac
