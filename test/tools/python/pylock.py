"""Turns pip's installation report (pip install --dry-run --report) into a
lock file for `pip install --require-hashes --no-deps -r`: one line per
package, its exact version and the sha256 of the file pip chose for this
platform and Python."""
import json
import sys


def main(report_path, out_path, header):
    with open(report_path) as f:
        report = json.load(f)
    lines = []
    for item in report["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        version = item["metadata"]["version"]
        info = item.get("download_info", {})
        hashes = info.get("archive_info", {}).get("hashes", {})
        sha = hashes.get("sha256")
        if not sha:
            h = info.get("archive_info", {}).get("hash", "")
            if h.startswith("sha256="):
                sha = h[len("sha256="):]
        if not sha:
            sys.exit(f"pylock: no sha256 for {name}=={version} ({info.get('url')})")
        lines.append(f"{name}=={version} --hash=sha256:{sha}")
    lines.sort()
    with open(out_path, "w") as f:
        f.write(header)
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
