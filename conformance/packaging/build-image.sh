#!/usr/bin/env bash
# Builds weft's OCI image locally, without a registry to pull from and without a docker daemon, and measures it.
#
#   conformance/packaging/build-image.sh [--push] [--minimal-base] [--tag IMAGE] [RELEASE_DIR]
#
# RELEASE_DIR (or $WEFT_RELEASE_DIR, default target/release) holds `weft`, `weft-control` and `weft-ca` from
# `cargo build --release --locked -p weft -p weft-control`, built on Debian 12 (the Dockerfile's build stage is
# rust:*-bookworm, so the glibc they need is the one the runtime stage carries).
#
# What it does:
#  1. Assembles a STAND-IN for gcr.io/distroless/cc-debian12:nonroot and commits it as
#     localhost/distroless-cc-debian12:nonroot. It is NOT Google's image: it is built here from the same Debian 12
#     packages distroless's cc-debian12 is made of (GoogleContainerTools/distroless static/config.bzl,
#     base/config.bzl, cc/config.bzl, common/BUILD.bazel):
#       static: base-files netbase tzdata media-types, the CA bundle of ca-certificates (only
#               /etc/ssl/certs/ca-certificates.crt and its copyright), /etc/passwd and /etc/group (root, nobody 65534,
#               nonroot 65532; tty, staff), /etc/nsswitch.conf, /tmp (1777), /root, /home/nonroot (65532, 0700),
#               /etc/os-release, /var/lib/dpkg/status.d/<package> for scanners;
#       base:   libc6 libssl3;       cc: libgcc-s1 gcc-12-base libgomp1 libstdc++6;
#     config: User 65532, WorkingDir /home/nonroot, PATH and SSL_CERT_FILE as distroless sets them. The packages
#     come from this machine's apt sources (which must be bookworm), at their current versions, so they can be
#     newer than the ones a given distroless digest carries. Docs, man pages, info and locales are dropped
#     (the packages' copyright files stay). With --minimal-base, libssl3, libstdc++6 and libgomp1 are left out
#     unless the binaries link them (ELF NEEDED), to show what the image would weigh on a leaner base.
#  2. Builds the Dockerfile's final stage on that base. The stage is taken from the Dockerfile's text (everything
#     from its last FROM), so it cannot drift: its FROM must be gcr.io/distroless/cc-debian12:nonroot (replaced by
#     the stand-in), and each `COPY --from=<build stage> /out/...` becomes a copy from a build context holding the
#     host's binaries at the paths the build stage's `install ... target/release/<bin> /out/<bin>` lines name.
#  3. Checks the image (User 65532:65532, Entrypoint /usr/local/bin/weft), runs `weft --version` and
#     `weft-ca --help` in it and lists the libraries ld.so resolves there, and measures it: the binaries, the
#     uncompressed layers, the gzip-compressed layers as pushed.
#  4. With --push (or WEFT_IMAGE_PUSH=1): starts Debian's docker-registry (the CNCF distribution registry) on a free
#     loopback port with a temporary config, pushes the image there with `buildah push --tls-verify=false`, reads the
#     manifest back and checks its digest, and reports the compressed size the registry holds.
#
# $WEFT_DOCKERFILE reads another Dockerfile (default: the repository's), $WEFT_IMAGE names the image (--tag),
# $WEFT_IMAGE_KEEP_WORK=1 keeps the temporary directory, $SOURCE_DATE_EPOCH sets the timestamps (default: HEAD's).
# Needs root (or `buildah unshare`), buildah, apt-get, dpkg-deb, jq, tar; curl and docker-registry for --push.
# The images stay in buildah's storage: `buildah images`, `buildah rmi localhost/weft:dev`.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dockerfile="${WEFT_DOCKERFILE:-$repo/Dockerfile}"

upstream_base="gcr.io/distroless/cc-debian12:nonroot"
standin_base="localhost/distroless-cc-debian12:nonroot"
image="${WEFT_IMAGE:-localhost/weft:dev}"
release_dir="${WEFT_RELEASE_DIR:-$repo/target/release}"
push="${WEFT_IMAGE_PUSH:-0}"
minimal=0
nonroot=65532
nobody=65534

die() {
    echo "build-image.sh: error: $*" >&2
    exit 1
}
say() { printf '\n== %s\n' "$*"; }

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
        --push) push=1 ;;
        --minimal-base) minimal=1 ;;
        --tag)
            [[ $# -ge 2 ]] || die "--tag needs an image name"
            image="$2"
            shift
            ;;
        -h | --help) usage 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) release_dir="$1" ;;
    esac
    shift
done
if ((minimal)); then
    standin_base="localhost/distroless-cc-debian12:nonroot-minimal"
fi

# --- prerequisites -----------------------------------------------------------------------------------------------
if ! command -v buildah >/dev/null 2>&1; then
    die "buildah is not installed. On Debian/Ubuntu: apt-get update && apt-get install -y buildah
    (Fedora: dnf install buildah). It builds OCI images without a daemon; this script needs nothing else from a
    container runtime."
fi
for tool in apt-get dpkg-deb jq tar gzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (apt-get install -y ${tool/dpkg-deb/dpkg})"
done
if ((push)); then
    command -v docker-registry >/dev/null 2>&1 || die "--push needs Debian's docker-registry: apt-get install -y docker-registry"
    command -v curl >/dev/null 2>&1 || die "--push needs curl: apt-get install -y curl"
fi
[[ $(id -u) -eq 0 ]] || die "run as root (or under \`buildah unshare\`): the base's files are owned by root and 65532"
[[ -f "$dockerfile" ]] || die "no Dockerfile at $dockerfile"
resolved="$(cd "$release_dir" 2>/dev/null && pwd)" || die "release directory $release_dir does not exist"
release_dir="$resolved"
for bin in weft weft-control weft-ca; do
    [[ -x "$release_dir/$bin" ]] ||
        die "$release_dir/$bin is missing: cargo build --release --locked -p weft -p weft-control (or pass the directory)"
done
arch="$(dpkg --print-architecture)"
base_files_version="$(apt-cache policy base-files | awk '/Candidate:/ {print $2}')"
[[ "$base_files_version" == 12.* ]] ||
    die "apt's base-files candidate is '${base_files_version}', not Debian 12's: the stand-in must be built from bookworm packages"

# buildah's storage: the default (overlay here), or vfs where overlay cannot mount; $STORAGE_DRIVER wins if set.
bh=(buildah)
if [[ -z "${STORAGE_DRIVER:-}" ]]; then
    if probe="$(buildah from scratch 2>/dev/null)"; then
        buildah rm "$probe" >/dev/null
    else
        echo "the default storage driver does not work here; using vfs (separate storage root /var/lib/containers/storage-vfs)"
        bh=(buildah --storage-driver vfs --root /var/lib/containers/storage-vfs)
    fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/weft-image.XXXXXX")"
containers=()
registry_pid=""
cleanup() {
    local c
    for c in "${containers[@]}"; do
        "${bh[@]}" umount "$c" >/dev/null 2>&1 || true
        "${bh[@]}" rm "$c" >/dev/null 2>&1 || true
    done
    if [[ -n "$registry_pid" ]]; then
        kill "$registry_pid" 2>/dev/null || true
        wait "$registry_pid" 2>/dev/null || true
    fi
    if [[ "${WEFT_IMAGE_KEEP_WORK:-0}" == 1 ]]; then
        echo "work directory kept: $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

# The image a tag named before (re)building it; after, that image is removed if nothing names it any more.
image_id() { "${bh[@]}" images -q --no-trunc "$1" 2>/dev/null | head -n 1 || true; }
drop_if_untagged() {
    [[ -n "$1" ]] || return 0
    if "${bh[@]}" images --json | jq -e --arg id "${1#sha256:}" \
        'map(select(.id as $short | $id | startswith($short))) | any(.[]; (.names // []) | length == 0)' >/dev/null; then
        "${bh[@]}" rmi "$1" >/dev/null 2>&1 || true
    fi
}

# Bytes, and MiB with one decimal.
human() { awk -v b="$1" 'BEGIN { printf "%d bytes (%.1f MiB)", b, b / 1048576 }'; }

# The shared libraries a binary needs (ELF NEEDED).
needed() {
    if command -v readelf >/dev/null 2>&1; then
        readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
    else
        ldd "$1" | awk '{print $1}'
    fi
}

# --- 0. the Dockerfile's final stage (read first: a Dockerfile this script no longer fits fails at once) ------------
# Instructions with their continuation lines joined, comments and blank lines dropped.
instructions() {
    awk '
        /^[[:space:]]*#/ { next }
        { line = cont $0; cont = "" }
        /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, "", line); cont = line " "; next }
        line ~ /^[[:space:]]*$/ { next }
        { print line }
    ' "$dockerfile"
}
mapfile -t all < <(instructions)
last_from=-1
for i in "${!all[@]}"; do
    [[ "${all[$i]}" =~ ^[[:space:]]*[Ff][Rr][Oo][Mm][[:space:]] ]] && last_from=$i
done
((last_from >= 0)) || die "no FROM in $dockerfile"
read -r _ from_image from_as from_name _ <<<"${all[$last_from]}"
[[ "${from_image%@sha256:*}" == "$upstream_base" ]] ||
    die "the Dockerfile's final stage is FROM ${from_image}, not ${upstream_base}:" \
        "the stand-in base this script builds no longer matches; update the script"

# The build stage's outputs: `install ... target/release/<bin> /out/<bin>`.
ctx="$work/context"
mkdir -p "$ctx"
declare -A provided=()
while read -r src dst; do
    bin="${src#target/release/}"
    [[ -x "$release_dir/$bin" ]] || die "the build stage installs $src as $dst but $release_dir/$bin is missing"
    install -D -m 0755 "$release_dir/$bin" "$ctx/${dst#/}"
    provided["$dst"]=1
done < <(grep -oE 'target/release/[A-Za-z0-9_.-]+ +/[^ &\\]+' "$dockerfile" | sed 's/  */ /g')
((${#provided[@]} > 0)) || die "found no \`install ... target/release/<bin> /out/<bin>\` in the Dockerfile's build stage"

containerfile="$work/Containerfile"
{
    echo "# Generated by conformance/packaging/build-image.sh from $(realpath --relative-to="$repo" "$dockerfile")'s final stage."
    # Global ARGs (before the first FROM) stay in scope for the stage's FROM.
    for ((i = 0; i < last_from; i++)); do
        [[ "${all[$i]}" =~ ^[[:space:]]*[Aa][Rr][Gg][[:space:]] ]] && echo "${all[$i]}"
        [[ "${all[$i]}" =~ ^[[:space:]]*[Ff][Rr][Oo][Mm][[:space:]] ]] && break
    done
    echo "FROM $standin_base${from_as:+ $from_as $from_name}"
    for ((i = last_from + 1; i < ${#all[@]}; i++)); do
        ins="${all[$i]}"
        if [[ "$ins" =~ ^[[:space:]]*(COPY|ADD)[[:space:]] ]]; then
            read -ra words <<<"$ins"
            if [[ "${words[1]}" != --from=* ]]; then
                die "the final stage copies from the build context ($ins): not supported, update the script"
            fi
            out=("${words[0]}")
            srcs=("${words[@]:2}")
            dest="${srcs[-1]}"
            unset 'srcs[-1]'
            for s in "${srcs[@]}"; do
                [[ -n "${provided[$s]:-}" ]] ||
                    die "the final stage copies $s from ${words[1]#--from=}, which this script does not provide"
                out+=("${s#/}")
            done
            out+=("$dest")
            echo "${out[*]}"
        else
            echo "$ins"
        fi
    done
} >"$containerfile"

# --- 1. the stand-in base ----------------------------------------------------------------------------------------
say "1. stand-in for $upstream_base (from Debian 12 packages, NOT Google's image) -> $standin_base"
links="$(for bin in weft weft-control weft-ca; do needed "$release_dir/$bin"; done | sort -u | paste -sd ' ')"
echo "weft, weft-control and weft-ca link: $links"
packages=(base-files netbase tzdata media-types libc6 libssl3 gcc-12-base libgcc-s1 libgomp1 libstdc++6)
if ((minimal)); then
    packages=(base-files netbase tzdata media-types libc6 gcc-12-base libgcc-s1)
    [[ " $links " == *" libssl.so.3 "* || " $links " == *" libcrypto.so.3 "* ]] && packages+=(libssl3)
    [[ " $links " == *" libstdc++.so.6 "* ]] && packages+=(libstdc++6)
    [[ " $links " == *" libgomp.so.1 "* ]] && packages+=(libgomp1)
fi
debs="$work/debs"
rootfs="$work/rootfs"
mkdir -p "$debs" "$rootfs" "$work/cacerts"
(cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "${packages[@]}" ca-certificates >/dev/null) ||
    die "apt-get download failed (run apt-get update?)"
mkdir -p "$rootfs/var/lib/dpkg/status.d"
package_list=()
for deb in "$debs"/*.deb; do
    name="$(dpkg-deb -f "$deb" Package)"
    version="$(dpkg-deb -f "$deb" Version)"
    package_list+=("$name=$version")
    if [[ "$name" == ca-certificates ]]; then
        dpkg-deb -x "$deb" "$work/cacerts"
    else
        dpkg-deb -x "$deb" "$rootfs"
    fi
    # What distroless writes for scanners (one control paragraph per package).
    { dpkg-deb -f "$deb" && echo "Status: install ok installed"; } >"$rootfs/var/lib/dpkg/status.d/$name"
done
echo "packages: ${package_list[*]}"

# The CA bundle, as update-ca-certificates makes it from every certificate ca-certificates ships (distroless's
# cacerts rule does the same); nothing else of the package.
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/usr/share/doc/ca-certificates"
while IFS= read -r crt; do
    cat "$crt"
    [[ -z "$(tail -c 1 "$crt")" ]] || echo
done < <(find "$work/cacerts/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort) >"$rootfs/etc/ssl/certs/ca-certificates.crt"
cp "$work/cacerts/usr/share/doc/ca-certificates/copyright" "$rootfs/usr/share/doc/ca-certificates/"
ncerts="$(grep -c 'BEGIN CERTIFICATE' "$rootfs/etc/ssl/certs/ca-certificates.crt")"
((ncerts > 100)) || die "the CA bundle has only $ncerts certificates"

# Users, groups and directories exactly as distroless's common/BUILD.bazel declares them.
cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nobody:x:$nobody:$nobody:nobody:/nonexistent:/sbin/nologin
nonroot:x:$nonroot:$nonroot:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
nobody:x:$nobody:
tty:x:5:
staff:x:50:
nonroot:x:$nonroot:
EOF
cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd:         compat
group:          compat
shadow:         compat
gshadow:        files
hosts:          files dns
networks:       files
protocols:      db files
services:       db files
ethers:         db files
rpc:            db files
netgroup:       nis
EOF
rm -f "$rootfs/etc/os-release" "$rootfs/usr/lib/os-release"
cat >"$rootfs/usr/lib/os-release" <<'EOF'
PRETTY_NAME="Distroless stand-in (weft build-image.sh, from Debian 12 packages)"
NAME="Debian GNU/Linux"
ID="debian"
VERSION_ID="12"
VERSION="Debian GNU/Linux 12 (bookworm)"
HOME_URL="https://github.com/GoogleContainerTools/distroless"
EOF
ln -s ../usr/lib/os-release "$rootfs/etc/os-release"
install -d -m 1777 "$rootfs/tmp"
install -d -m 0700 "$rootfs/root"
install -d -m 0755 "$rootfs/home"
install -d -m 0700 -o "$nonroot" -g "$nonroot" "$rootfs/home/nonroot"
chmod 0755 "$rootfs"

# Docs, man pages, info, locales and lintian overrides go; each package's copyright stays.
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$rootfs/usr/share/man" "$rootfs/usr/share/info" "$rootfs/usr/share/locale" "$rootfs/usr/share/lintian" \
    "$rootfs/usr/share/doc-base" "$rootfs/usr/share/bug" "$rootfs/usr/share/gdb" "$rootfs/usr/share/gcc"

# One layer, ownership as in the tree (buildah copy would make everything root's, /home/nonroot included).
tar -C "$rootfs" --numeric-owner --sort=name -cf "$work/base.tar" .
base_ctr="$("${bh[@]}" from scratch)"
containers+=("$base_ctr")
"${bh[@]}" add "$base_ctr" "$work/base.tar" / >/dev/null
"${bh[@]}" config \
    --os linux --arch "$arch" \
    --user "$nonroot" --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --label "org.opencontainers.image.title=distroless-cc-debian12 stand-in" \
    --label "org.opencontainers.image.description=A local stand-in for $upstream_base, assembled by weft's\
 conformance/packaging/build-image.sh from Debian 12 packages; not Google's image" \
    --label "io.weft.stand-in.packages=${package_list[*]}" \
    --created-by "weft conformance/packaging/build-image.sh: stand-in for $upstream_base from Debian 12 packages" \
    "$base_ctr"
old_base="$(image_id "$standin_base")"
"${bh[@]}" commit -q --timestamp 0 "$base_ctr" "$standin_base" >/dev/null
"${bh[@]}" rm "$base_ctr" >/dev/null
containers=()
base_tar_bytes="$(stat -c %s "$work/base.tar")"
echo "committed $standin_base: one layer, $(human "$base_tar_bytes") uncompressed"

# --- 2. the Dockerfile's runtime stage on it ---------------------------------------------------------------------
say "2. the Dockerfile's final stage, FROM $standin_base, binaries from $release_dir"
echo "--- generated Containerfile (build context: ${!provided[*]})"
cat "$containerfile"
echo "---"

old_image="$(image_id "$image")"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
"${bh[@]}" build --isolation chroot --pull=never --layers=false --timestamp "$epoch" \
    --label "org.opencontainers.image.base.name=$standin_base (stand-in for $upstream_base)" \
    -f "$containerfile" -t "$image" "$ctx" >"$work/build.log" 2>&1 ||
    {
        cat "$work/build.log" >&2
        die "buildah build failed"
    }
drop_if_untagged "$old_image"
drop_if_untagged "$old_base"
head_commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo "an unknown commit")"
echo "built $image (Dockerfile at $head_commit; file and created timestamps $epoch)"

# --- 3. checks and sizes -----------------------------------------------------------------------------------------
say "3. checks"
config="$("${bh[@]}" inspect --type image "$image" | jq '.OCIv1.config')"
user="$(jq -r '.User' <<<"$config")"
entrypoint="$(jq -c '.Entrypoint' <<<"$config")"
cmd="$(jq -c '.Cmd' <<<"$config")"
ports="$(jq -r '.ExposedPorts | keys | join(" ")' <<<"$config")"
[[ "$user" == "$nonroot:$nonroot" ]] || die "the image's User is '$user', not $nonroot:$nonroot"
[[ "$entrypoint" == '["/usr/local/bin/weft"]' ]] || die "the image's Entrypoint is $entrypoint, not [\"/usr/local/bin/weft\"]"
echo "User $user, Entrypoint $entrypoint, Cmd $cmd, ExposedPorts $ports: ok"

ctr="$("${bh[@]}" from --pull=never "$image")"
containers+=("$ctr")
mnt="$("${bh[@]}" mount "$ctr")"
for f in etc/passwd etc/group etc/services etc/nsswitch.conf etc/ssl/certs/ca-certificates.crt usr/share/zoneinfo/UTC \
    etc/mime.types tmp home/nonroot; do
    [[ -e "$mnt/$f" ]] || die "/$f is missing from the image"
done
[[ "$(stat -c '%u:%g %a' "$mnt/home/nonroot")" == "$nonroot:$nonroot 700" ]] || die "/home/nonroot is not $nonroot's (0700)"
[[ "$(stat -c '%a' "$mnt/tmp")" == 1777 ]] || die "/tmp is not 1777"
[[ ! -e "$mnt/bin/sh" ]] || die "the image has a shell"
echo "base files present (passwd, group, services, nsswitch.conf, CA bundle with $ncerts certificates, zoneinfo,"
echo "mime.types, /tmp 1777, /home/nonroot 65532 0700); no /bin/sh"

echo "libraries the image's ld.so resolves (the binaries' ELF interpreter, run in the image's root):"
for bin in weft weft-control weft-ca; do
    interp="$(readelf -l "$release_dir/$bin" 2>/dev/null | sed -n 's/.*program interpreter: \(.*\)\]/\1/p')"
    interp="${interp:-/lib64/ld-linux-x86-64.so.2}"
    echo "  /usr/local/bin/$bin (interpreter $interp):"
    chroot "$mnt" "$interp" --list "/usr/local/bin/$bin" | sed 's/^[[:space:]]*/    /' ||
        die "$bin's libraries do not resolve in the image"
    if chroot "$mnt" "$interp" --list "/usr/local/bin/$bin" | grep -q 'not found'; then
        die "$bin needs a library the image lacks"
    fi
done

# In the image as its user: buildah run (chroot isolation), or chroot into the mounted image if that cannot run here.
# The output goes to $work/out (run_how is set in this shell, not in a command substitution's).
run_in_image() {
    if "${bh[@]}" run --isolation chroot --user "$nonroot:$nonroot" "$ctr" -- "$@" >"$work/out" 2>"$work/run.err"; then
        run_how="buildah run --isolation chroot"
    else
        run_how="chroot --userspec=$nonroot:$nonroot, as buildah run failed: $(head -c 200 "$work/run.err")"
        chroot --userspec="$nonroot:$nonroot" "$mnt" "$@" >"$work/out"
    fi
}
run_in_image /usr/local/bin/weft --version || die "weft --version failed in the image"
weft_version="$(cat "$work/out")"
echo "weft --version in the image ($run_how): $weft_version"
run_in_image /usr/local/bin/weft-ca --help || die "weft-ca --help failed in the image"
echo "weft-ca --help in the image ($run_how), first lines:"
head -n 3 "$work/out" | sed 's/^/  /'
"${bh[@]}" umount "$ctr" >/dev/null
"${bh[@]}" rm "$ctr" >/dev/null
containers=()

say "sizes"
weft_bytes="$(stat -c %s "$release_dir/weft")"
ca_bytes="$(stat -c %s "$release_dir/weft-ca")"
# The layers as a registry gets them (gzip), from an OCI layout buildah writes; uncompressed, by inflating them.
"${bh[@]}" push -q "$image" "oci:$work/oci:weft" >/dev/null
manifest_digest="$(jq -r '.manifests[0].digest' "$work/oci/index.json")"
manifest="$(cat "$work/oci/blobs/sha256/${manifest_digest#sha256:}")"
mapfile -t layer_digests < <(jq -r '.layers[].digest' <<<"$manifest")
mapfile -t gz_layers < <(jq -r '.layers[].size' <<<"$manifest")
((${#gz_layers[@]} == 2)) || die "expected 2 layers (stand-in base, weft's COPY), got ${#gz_layers[@]}"
raw_layers=()
for d in "${layer_digests[@]}"; do
    raw_layers+=("$(gzip -dc "$work/oci/blobs/sha256/${d#sha256:}" | wc -c)")
done
gz_total="$(jq '([.layers[].size] | add) + .config.size' <<<"$manifest")"
raw_total=$((raw_layers[0] + raw_layers[1]))
echo "weft binary:        $(human "$weft_bytes")"
echo "weft-ca binary:     $(human "$ca_bytes")"
echo "base layer:         $(human "${raw_layers[0]}") uncompressed, $(human "${gz_layers[0]}") gzip"
echo "weft layer:         $(human "${raw_layers[1]}") uncompressed, $(human "${gz_layers[1]}") gzip"
echo "image uncompressed: $(human "$raw_total") (layer tars)"
echo "image compressed:   $(human "$gz_total") (gzip layers + config, as pushed)"

# --- 4. a real registry ------------------------------------------------------------------------------------------
registry_line="not pushed (--push pushes to a local docker-registry)"
if ((push)); then
    say "4. push to a local CNCF distribution registry (Debian's docker-registry)"
    reg="$work/registry"
    mkdir -p "$reg/data"
    addr=""
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 40000))
        cat >"$reg/config.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $reg/data
http:
  addr: 127.0.0.1:$port
EOF
        docker-registry serve "$reg/config.yml" >"$reg/log" 2>&1 &
        registry_pid=$!
        for _ in $(seq 100); do
            grep -q 'listening on' "$reg/log" && break
            kill -0 "$registry_pid" 2>/dev/null || break
            sleep 0.1
        done
        if grep -q 'listening on' "$reg/log"; then
            addr="127.0.0.1:$port"
            break
        fi
        kill "$registry_pid" 2>/dev/null || true
        wait "$registry_pid" 2>/dev/null || true
        registry_pid=""
    done
    [[ -n "$addr" ]] || die "docker-registry did not start: $(tail -n 5 "$reg/log")"
    echo "docker-registry on $addr (pid $registry_pid)"
    repo_tag="weft:${image##*:}"
    "${bh[@]}" push -q --tls-verify=false --digestfile "$work/digest" "$image" "docker://$addr/$repo_tag" >/dev/null
    pushed_digest="$(cat "$work/digest")"
    accept='application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json'
    curl -fsS -H "Accept: $accept" -D "$work/headers" -o "$work/manifest.json" "http://$addr/v2/weft/manifests/${image##*:}"
    served_digest="$(tr -d '\r' <"$work/headers" | awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}')"
    computed="sha256:$(sha256sum "$work/manifest.json" | cut -d' ' -f1)"
    [[ "$computed" == "$pushed_digest" && "$served_digest" == "$pushed_digest" ]] ||
        die "digests differ: buildah push $pushed_digest, registry header $served_digest, manifest bytes $computed"
    reg_total="$(jq '([.layers[].size] | add) + .config.size' "$work/manifest.json")"
    reg_layers="$(jq -r '[.layers[].size | tostring] | join(" + ")' "$work/manifest.json")"
    echo "manifest $pushed_digest ($(jq -r '.mediaType // "oci"' "$work/manifest.json")):"
    echo "buildah's digest, the registry's Docker-Content-Digest and the manifest bytes' sha256 agree"
    echo "registry holds: layers $reg_layers + config $(jq '.config.size' "$work/manifest.json") = $(human "$reg_total")"
    registry_line="$(human "$reg_total") in the registry, manifest $pushed_digest"
fi

say "summary"
cat <<EOF
image:              $image (the Dockerfile's runtime stage, built with buildah)
base:               $standin_base
                    a STAND-IN for $upstream_base assembled from Debian 12 packages, not Google's image:
                    ${package_list[*]}
                    (CA bundle only from ca-certificates; docs/man/locales dropped)
binaries:           weft $(human "$weft_bytes"), weft-ca $(human "$ca_bytes") (from $release_dir; they link: $links)
config:             User $user, Entrypoint $entrypoint, Cmd $cmd, ports $ports
in the image:       $weft_version; weft-ca --help ok
uncompressed:       $(human "$raw_total") (base $(human "${raw_layers[0]}"), weft $(human "${raw_layers[1]}"))
compressed (gzip):  $(human "$gz_total") (base $(human "${gz_layers[0]}"), weft $(human "${gz_layers[1]}"), with config)
registry:           $registry_line
EOF
