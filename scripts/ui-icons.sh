#!/usr/bin/env bash
# Draws the web console's app icons (gateway-edge/ui/icon-192.png, icon-512.png, named by the
# web app manifest gateway-edge/ui/manifest.webmanifest) from the favicon's mark, enlarged on a
# full-bleed accent square so the icon also works as a "maskable" one (the mark stays inside the
# central 80 % safe zone). Rasterized once by headless Chromium; the PNGs are committed, so nothing
# runs at build time. Run again only when the mark changes: `bash scripts/ui-icons.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
chromium="${COFFER_TEST_CHROMIUM:-/usr/bin/chromium}"
tmp="$(mktemp -d /tmp/coffer-ui-icons.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
for size in 192 512; do
  cat > "$tmp/icon.html" <<HTML
<!doctype html><html><head><style>html,body{margin:0;width:${size}px;height:${size}px;overflow:hidden}svg{display:block}</style></head>
<body><svg xmlns="http://www.w3.org/2000/svg" width="${size}" height="${size}" viewBox="0 0 32 32">
<rect width="32" height="32" fill="#5b49c9"/>
<g transform="translate(16 16) scale(0.6) translate(-16 -16)">
<rect x="3" y="7" width="26" height="20" rx="4" fill="#ffffff"/><rect x="7" y="3" width="18" height="6" rx="2" fill="#c9c0fa"/>
<circle cx="16" cy="17" r="4" fill="#5b49c9"/><rect x="15" y="17" width="2" height="6" fill="#5b49c9"/></g></svg></body></html>
HTML
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="${size},${size}" --screenshot="$tmp/icon-${size}.png" "file://$tmp/icon.html" >/dev/null 2>&1
  cp "$tmp/icon-${size}.png" "gateway-edge/ui/icon-${size}.png"
done
file gateway-edge/ui/icon-192.png gateway-edge/ui/icon-512.png
