#!/bin/sh
# Prepares an nginx build tree configured exactly like the installed nginx binary, for building a
# dynamic module against it where the distribution ships no nginx-dev (Alpine): fetches the
# source of the binary's version, and runs ./configure with the binary's own configure arguments
# (`nginx -V`), less the modules that are not part of the binary itself (third-party
# --add-module/--add-dynamic-module and --with-*=dynamic: their sources and libraries are not
# here, and they do not change the core's structures or the module signature).
#   nginx-source-tree.sh DEST      -> DEST/nginx (NGINX_SOURCE_DIR), DEST/nginx/objs (NGINX_BUILD_DIR)
# NGINX_SOURCE_SHA256, when set, must match the downloaded tarball. NGINX_SOURCE_URL (default:
# nginx.org's tarball of the installed version) fetches another source of the same version, e.g.
# file:///... (scripts/build-nginx-musl.sh builds its musl module through this script that way).
set -eu
dest=${1:?usage: nginx-source-tree.sh DEST}
version=$(nginx -v 2>&1 | sed -n 's|^nginx version: nginx/||p')
args=$(nginx -V 2>&1 | sed -n 's/^configure arguments: //p')
[ -n "$version" ] || { echo "no nginx version from 'nginx -v'" >&2; exit 1; }

mkdir -p "$dest"
cd "$dest"
curl -fsSL --retry 3 -o "nginx-$version.tar.gz" "${NGINX_SOURCE_URL:-https://nginx.org/download/nginx-$version.tar.gz}"
if [ -n "${NGINX_SOURCE_SHA256:-}" ]; then
  echo "$NGINX_SOURCE_SHA256  nginx-$version.tar.gz" | sha256sum -c -
fi
tar -xzf "nginx-$version.tar.gz"
rm -rf nginx && mv "nginx-$version" nginx
cd nginx

# The arguments as the shell would split them (`nginx -V` prints them quoted), then filtered.
eval "set -- $args"
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in
    --add-module=* | --add-dynamic-module=* | --with-*=dynamic) ;;
    *) set -- "$@" "$a" ;;
  esac
done
echo "configuring nginx $version with: $*" >&2
./configure "$@" > configure.log 2>&1 || { tail -n 30 configure.log >&2; exit 1; }
test -f objs/ngx_auto_config.h
