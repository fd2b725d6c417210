#!/bin/sh
# Copy the front-end files listed in static/vendor-files.txt from node_modules into static/vendor.
# Run from the repository root after `npm ci`; used by `make` and by the Dockerfile's Node stage.
set -eu
list=static/vendor-files.txt
dest=static/vendor
mkdir -p "$dest"
grep -v -e '^#' -e '^[[:space:]]*$' "$list" | while read -r src; do
  cp "$src" "$dest/"
done
