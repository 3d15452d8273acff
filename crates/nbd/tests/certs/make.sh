#!/usr/bin/env bash
# Writes the certificates the TLS tests of this crate use (tests/tls.rs), valid for 100 years
# so that the committed files keep working: a CA, a server certificate for 127.0.0.1, client
# certificates for "alice" and "bob" signed by that CA, and one for "alice" signed by another
# CA (which the server must refuse). Test keys only; they protect nothing.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() { # NAME CN
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days "$days" -out "$1.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

leaf() { # NAME CN CA USAGE EXTRA_EXTENSIONS...
    local name="$1" cn="$2" ca="$3" usage="$4"
    shift 4
    key "$name.key"
    openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$work/$name.csr"
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=digitalSignature"
        echo "extendedKeyUsage=$usage"
        printf '%s\n' "$@"
    } >"$work/$name.ext"
    openssl x509 -req -in "$work/$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial \
        -CAserial "$work/$ca.srl" -days "$days" -extfile "$work/$name.ext" -out "$name.pem" 2>/dev/null
}

ca ca bucketfs-test-ca
ca other-ca bucketfs-other-ca
leaf server 127.0.0.1 ca serverAuth "subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf alice alice ca clientAuth
leaf bob bob ca clientAuth
leaf mallory alice other-ca clientAuth
rm -f ca.key other-ca.key
