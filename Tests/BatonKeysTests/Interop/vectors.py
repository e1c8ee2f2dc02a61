#!/usr/bin/env python3
"""The independent side of docs/security.md's test vectors (§8).

Computes every vector from its inputs with Python's `cryptography` package (PyPI; OpenSSL
underneath) and, when `pycryptodome` is installed too, a second time with pycryptodome's own
AES, CCM, GCM and HKDF (no OpenSSL): two implementations that share no code with each other.
Then it compares both with the hex written in EXPECTED below, which is the hex of
docs/security.md §8 and of Tests/BatonKeysTests/VectorTests.swift.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install cryptography pycryptodome
    /tmp/venv/bin/python Tests/BatonKeysTests/Interop/vectors.py          # check, exit 0/1
    /tmp/venv/bin/python Tests/BatonKeysTests/Interop/vectors.py --print  # print the vectors

Exit status: 0 all agree, 1 a mismatch (printed), 3 `cryptography` missing.
"""
import base64
import sys

try:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:
    sys.stderr.write("the `cryptography` package is missing for %s: pip install cryptography\n" % sys.executable)
    sys.exit(3)

try:
    from Crypto.Cipher import AES as PCD_AES
    from Crypto.Hash import SHA256 as PCD_SHA256
    from Crypto.Protocol.KDF import HKDF as PCD_HKDF
except ImportError:
    PCD_AES = None

H = bytes.fromhex

# ---- Inputs (docs/security.md §8) ------------------------------------------------------------

SECRET = H("000102030405060708090a0b0c0d0e0f")
# Core 5.4, Vol 3, Part H, §D.7: the sample data for ah.
CORE_IRK = H("ec0234a357c8ad05341010a60a397d9b")
CORE_PRAND = 0x708194
# docs/protocol.md §2.5 vector 1: the 31-byte advertisement before its tag.
VECTOR1_UNSIGNED = H("020106" "1bffffff" "01030201b74b9bbed4c3b2a19a78563412" "5a8000" "00000000")
# §8.4: vector 1 again, with the group hash derived from SECRET and a device id resolvable
# with its beacon key (prand 0x5A1234), so a gateway holding that key accepts it whole.
PRAND_B = 0x5A1234
# §8.5: the activity payload of docs/payload.md §5, sealed for vector 1 (device id, sequence 258).
PAYLOAD = H(
    "a600010178 1a636f6d2e6578616d706c652e7265616465722e61727469636c65"
    "0269436861707465722033"
    "03d820781b68747470733a2f2f6578616d706c652e636f6d2f626f6f6b732f33"
    "048168706f736974696f6e"
    "05a3656e69676874f565 7363616c65f93e0068706f736974696f6e1904d2".replace(" ", ""))
SEAL_NONCE = H("a0a1a2a3a4a5a6a7a8a9aaab")
DEVICE_ID = 0x5A123456789A
SEQUENCE = 258
# §8.6: device identities 0 and 3 (§3.1); device 3 makes its id with IK_3 for prand 0x5A1234
# and sends §8.4's beacon under it, tagged with the beacon key.
IDENTITY_NUMBERS = (0, 3)
IDENTITY_NUMBER = 3

EXPECTED = {
    "secret.text": "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL",
    "beacon_key": "2cabcb7c48e938d4343275273bb1bd42",
    "beacon_key.text": "BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO",
    "payload_key": "6216f930ddbd11d714c6bbff8deb51d2",
    "group_hash": "7cec7226",
    "core.ah": "0dfbaa",
    "device_id": "5a1234e5dcbb",
    "beacon1.nonce": "9a785634125affff0302010000",
    "beacon1": "0201061bffffff01030201b74b9bbed4c3b2a19a785634125a80006702f232",
    "beacon2": "0201061bffffff01030201b74b9bbe2672ec7cbbdce534125a800060d4913b",
    "payload.context": "019a785634125a0201",
    "identity_key.0": "a27b4aff4e6ed97d236325d0982263d4",
    "identity_key.3": "31d712aed33ec95df593bc5168a827f9",
    "identity_id.0": "7cec72260000",
    "identity_id.3": "7cec72260003",
    "device_id.ik3": "5a1234e93c45",
    "beacon3.nonce": "453ce934125affff0302010000",
    "beacon3": "0201061bffffff01030201b74b9bbe2672ec7c453ce934125a800047fe9ca8",
    "sealed": "01a0a1a2a3a4a5a6a7a8a9aaabebbf607445343dfcb077b20efff7d9ce4ebaf669150d387d9401981145d70f4f0561462e87d65f6b2e083f5f85f53e1ccd393d9bdae84084a8ad61f96949a269243e9bfc3f43b0ebb9e77d5d2fff53a63257f7937e1c8d111f0055ab77ba07990e9a1883c9b766e1c9984bfe929c14eaf11ad793c799e34bf94572d9d52a7d9a9c723c7d",
}


# ---- Constructions, with `cryptography` -----------------------------------------------------

def crc10_atm(data):
    """CRC-10/ATM: poly 0x233, init 0, MSB first, no final XOR (check 0x199)."""
    crc = 0
    for b in data:
        crc ^= b << 2
        for _ in range(8):
            crc = ((crc << 1) ^ 0x233) if crc & 0x200 else (crc << 1)
            crc &= 0x3FF
    return crc


B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def text_form(prefix, key):
    crc = crc10_atm(key)
    return prefix + base64.b32encode(key).decode().rstrip("=") + B32[crc >> 5] + B32[crc & 0x1F]


def hkdf(ikm, info, length):
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(ikm)


def derive(secret):
    beacon = hkdf(secret, b"baton v1 beacon key", 16)
    payload = hkdf(secret, b"baton v1 payload key", 16)
    group_hash = int.from_bytes(hkdf(beacon, b"baton v1 group hash", 4), "little")
    return beacon, payload, group_hash


def ah(irk, prand):
    """Core 5.4, Vol 3, Part H, §2.2.2: e(k, 0^104 || r) mod 2^24, MSB first."""
    enc = Cipher(algorithms.AES(irk), modes.ECB()).encryptor()
    out = enc.update(bytes(13) + prand.to_bytes(3, "big")) + enc.finalize()
    return int.from_bytes(out[13:16], "big")


def device_id(irk, prand):
    return prand << 24 | ah(irk, prand)


def identity_key(beacon, n):
    """§3.1: IK_n = HKDF-SHA256(BK, salt "", info "baton v1 device identity" || n (2, LE), 16)."""
    return hkdf(beacon, b"baton v1 device identity" + n.to_bytes(2, "little"), 16)


def identity_id(gh, n):
    """§3.1: group hash (32 bits) || n (16 bits), printed as 12 hex digits like a device id."""
    return gh << 16 | n


def with_id(advert, gh, dev):
    """`advert` with the group hash and device id replaced (value offsets 8 and 12)."""
    adv = bytearray(advert)
    adv[15:19] = gh.to_bytes(4, "little")
    adv[19:25] = dev.to_bytes(6, "little")
    return bytes(adv)


def beacon_nonce(signed):
    # device id (6) || company id (2) || flags (1) || sequence as a 32-bit LE counter (4)
    return signed[14:20] + signed[0:2] + signed[3:4] + signed[4:6] + b"\x00\x00"


def beacon_tag(key, signed):
    assert len(signed) == 22
    return AESCCM(key, tag_length=4).encrypt(beacon_nonce(signed), b"", signed)


def with_tag(advert, key):
    signed = advert[5:27]
    return advert[:27] + beacon_tag(key, signed)


def payload_context(dev, seq):
    return b"\x01" + dev.to_bytes(6, "little") + seq.to_bytes(2, "little")


def seal(key, nonce, plaintext, context):
    return b"\x01" + nonce + AESGCM(key).encrypt(nonce, plaintext, b"\x01" + context)


# ---- The same, with pycryptodome (its own AES; no OpenSSL) -----------------------------------

def pcd_derive(secret):
    beacon = PCD_HKDF(secret, 16, None, PCD_SHA256, context=b"baton v1 beacon key")
    payload = PCD_HKDF(secret, 16, None, PCD_SHA256, context=b"baton v1 payload key")
    gh = int.from_bytes(PCD_HKDF(beacon, 4, None, PCD_SHA256, context=b"baton v1 group hash"), "little")
    return beacon, payload, gh


def pcd_identity_key(beacon, n):
    return PCD_HKDF(beacon, 16, None, PCD_SHA256, context=b"baton v1 device identity" + n.to_bytes(2, "little"))


def pcd_ah(irk, prand):
    out = PCD_AES.new(irk, PCD_AES.MODE_ECB).encrypt(bytes(13) + prand.to_bytes(3, "big"))
    return int.from_bytes(out[13:16], "big")


def pcd_beacon_tag(key, signed):
    c = PCD_AES.new(key, PCD_AES.MODE_CCM, nonce=beacon_nonce(signed), mac_len=4)
    c.update(signed)
    _, tag = c.encrypt_and_digest(b"")
    return tag


def pcd_seal(key, nonce, plaintext, context):
    c = PCD_AES.new(key, PCD_AES.MODE_GCM, nonce=nonce, mac_len=16)
    c.update(b"\x01" + context)
    ct, tag = c.encrypt_and_digest(plaintext)
    return b"\x01" + nonce + ct + tag


# ---- Compute ---------------------------------------------------------------------------------

def compute():
    v = {}
    beacon, payload, gh = derive(SECRET)
    v["secret.text"] = text_form("BATON-GROUP-V1:", SECRET)
    v["beacon_key"] = beacon.hex()
    v["beacon_key.text"] = text_form("BATON-BEACON-V1:", beacon)
    v["payload_key"] = payload.hex()
    v["group_hash"] = "%08x" % gh
    v["core.ah"] = "%06x" % ah(CORE_IRK, CORE_PRAND)
    v["device_id"] = "%012x" % device_id(beacon, PRAND_B)
    v["beacon1.nonce"] = beacon_nonce(VECTOR1_UNSIGNED[5:27]).hex()
    v["beacon1"] = with_tag(VECTOR1_UNSIGNED, beacon).hex()
    adv = bytearray(VECTOR1_UNSIGNED)
    adv[15:19] = gh.to_bytes(4, "little")
    adv[19:25] = device_id(beacon, PRAND_B).to_bytes(6, "little")
    v["beacon2"] = with_tag(bytes(adv), beacon).hex()
    for n in IDENTITY_NUMBERS:
        v["identity_key.%d" % n] = identity_key(beacon, n).hex()
        v["identity_id.%d" % n] = "%012x" % identity_id(gh, n)
    dev3 = device_id(identity_key(beacon, IDENTITY_NUMBER), PRAND_B)
    v["device_id.ik3"] = "%012x" % dev3
    adv3 = with_tag(with_id(VECTOR1_UNSIGNED, gh, dev3), beacon)
    v["beacon3.nonce"] = beacon_nonce(adv3[5:27]).hex()
    v["beacon3"] = adv3.hex()
    ctx = payload_context(DEVICE_ID, SEQUENCE)
    v["payload.context"] = ctx.hex()
    v["sealed"] = seal(payload, SEAL_NONCE, PAYLOAD, ctx).hex()
    return v


def compute_pycryptodome():
    v = {}
    beacon, payload, gh = pcd_derive(SECRET)
    v["beacon_key"] = beacon.hex()
    v["payload_key"] = payload.hex()
    v["group_hash"] = "%08x" % gh
    v["core.ah"] = "%06x" % pcd_ah(CORE_IRK, CORE_PRAND)
    dev = PRAND_B << 24 | pcd_ah(beacon, PRAND_B)
    v["device_id"] = "%012x" % dev
    v["beacon1"] = (VECTOR1_UNSIGNED[:27] + pcd_beacon_tag(beacon, VECTOR1_UNSIGNED[5:27])).hex()
    adv = bytearray(VECTOR1_UNSIGNED)
    adv[15:19] = gh.to_bytes(4, "little")
    adv[19:25] = dev.to_bytes(6, "little")
    v["beacon2"] = (bytes(adv[:27]) + pcd_beacon_tag(beacon, bytes(adv[5:27]))).hex()
    for n in IDENTITY_NUMBERS:
        v["identity_key.%d" % n] = pcd_identity_key(beacon, n).hex()
    ik3 = pcd_identity_key(beacon, IDENTITY_NUMBER)
    dev3 = PRAND_B << 24 | pcd_ah(ik3, PRAND_B)
    v["device_id.ik3"] = "%012x" % dev3
    adv3 = with_id(VECTOR1_UNSIGNED, gh, dev3)
    v["beacon3"] = (adv3[:27] + pcd_beacon_tag(beacon, adv3[5:27])).hex()
    v["sealed"] = pcd_seal(payload, SEAL_NONCE, PAYLOAD, payload_context(DEVICE_ID, SEQUENCE)).hex()
    return v


def main():
    failures = []
    if crc10_atm(b"123456789") != 0x199:
        failures.append("CRC-10/ATM check value")
    v = compute()
    if v["core.ah"] != "0dfbaa":
        failures.append("ah() does not give the Core spec's sample 0x0dfbaa: %s" % v["core.ah"])
    if "--print" in sys.argv:
        for k, x in v.items():
            print("%-16s %s" % (k, x))
    if PCD_AES is not None:
        for k, x in compute_pycryptodome().items():
            if v[k] != x:
                failures.append("%s: cryptography %s, pycryptodome %s" % (k, v[k], x))
    else:
        sys.stderr.write("pycryptodome not installed: checked with `cryptography` only\n")
    for k, x in EXPECTED.items():
        if v.get(k) != x:
            failures.append("%s: computed %s, documented %s" % (k, v.get(k), x))
    for f in failures:
        print("MISMATCH", f)
    if not failures:
        print("all %d vectors agree%s" % (len(v), "" if PCD_AES is None else " (cryptography and pycryptodome)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
