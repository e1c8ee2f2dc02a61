// The activity payload: an NSUserActivity's state as deterministic CBOR (RFC 8949 §4.2.1).
// docs/payload.md is the byte-by-byte spec; the section numbers below are its sections.
//
//   top level: a map with unsigned keys, strictly increasing (§2)
//     0 version                uint, 1                                   required
//     1 activity type          text, reverse-DNS (§2.1)                  required
//     2 title                  text, non-empty                           optional
//     3 webpage URL            tag 32 over text, http or https (§2.2)    optional
//     4 required userInfo keys array of text, non-empty, sorted, unique,
//                              each a key of userInfo (§2.3)             optional
//     5 userInfo               map text → value, non-empty (§3)          optional
//
// `ActivityPayload.validate` is the single entry point for untrusted bytes (fuzz targets
// call it): one walk, depth-limited recursion (≤ PayloadLimits.maxSupportedDepth frames),
// no allocation; it returns an `ActivityPayloadView` of offsets into the caller's bytes.

extension Malformed {
    /// More bytes than the configured hard cap (`PayloadLimits.maxBytes`).
    public static let payloadTooLarge = Malformed("payload-too-large")
    /// The top-level item is not a map (§2).
    public static let payloadNotMap = Malformed("payload-not-map")
    /// A top-level key that is not an unsigned integer (§2).
    public static let payloadKeyType = Malformed("payload-key-type")
    /// The version (0) or the activity type (1) is absent (§2).
    public static let payloadMissingField = Malformed("payload-missing-field")
    /// A top-level field of the wrong CBOR type, e.g. a title that is not text (§2).
    public static let payloadFieldType = Malformed("payload-field-type")
    /// An activity type that is not reverse-DNS: labels of [A-Za-z0-9_-], two or more (§2.1).
    public static let payloadActivityType = Malformed("payload-activity-type")
    /// A webpage URL whose scheme is not http or https (§2.2).
    public static let payloadURLScheme = Malformed("payload-url-scheme")
    /// A webpage URL without "//" and a host after its scheme (§2.2).
    public static let payloadURLNoHost = Malformed("payload-url-no-host")
    /// An optional field present but empty: absent is the one encoding of "none" (§2).
    public static let payloadEmptyField = Malformed("payload-empty-field")
    /// Required userInfo keys not sorted bytewise, or a key twice (§2.3).
    public static let payloadRequiredKeysOrder = Malformed("payload-required-keys-order")
    /// A required userInfo key that userInfo does not hold (§2.3).
    public static let payloadRequiredKeyMissing = Malformed("payload-required-key-missing")
}

/// The bounds a payload is validated against. The hard byte cap is configuration (the
/// gateway's "payload bytes per activity"); the rest bound the validator's work.
public struct PayloadLimits: Hashable, Sendable {
    /// 3 KB: what NSUserActivity's documentation recommends for userInfo, and what a device
    /// should aim for; a gateway may configure a larger hard cap.
    public static let recommendedMaxBytes = 3072
    public static let defaultMaxDepth = 16
    /// The largest depth cap accepted: it bounds the validator's recursion.
    public static let maxSupportedDepth = 64
    public static let defaultMaxItemsPerContainer = 1024

    /// Inputs longer than this are rejected before any byte is read.
    public var maxBytes: Int
    /// Containers (maps, arrays, sets) nested around the deepest item, the top-level map
    /// counting as 1 and userInfo as 2.
    public var maxDepth: Int
    /// Elements of an array or set, entries of a map.
    public var maxItemsPerContainer: Int

    public init(maxBytes: Int = recommendedMaxBytes, maxDepth: Int = defaultMaxDepth,
                maxItemsPerContainer: Int = defaultMaxItemsPerContainer) {
        precondition(maxBytes >= 0, "payload byte cap is negative")
        precondition(maxDepth >= 2 && maxDepth <= PayloadLimits.maxSupportedDepth,
                     "payload depth cap outside 2…\(PayloadLimits.maxSupportedDepth)")
        precondition(maxItemsPerContainer >= 1, "payload item cap below 1")
        self.maxBytes = maxBytes
        self.maxDepth = maxDepth
        self.maxItemsPerContainer = maxItemsPerContainer
    }

    public static let `default` = PayloadLimits()
}

// MARK: - The borrowed view

/// A validated payload: offsets into the caller's bytes, valid while they are.
public struct ActivityPayloadView {
    /// The whole payload.
    public let bytes: UnsafeRawBufferPointer
    public let version: Int
    /// UTF-8 of the reverse-DNS activity type.
    public let activityType: UnsafeRawBufferPointer
    /// UTF-8 of the title; nil when absent.
    public let title: UnsafeRawBufferPointer?
    /// UTF-8 of the http(s) webpage URL; nil when absent.
    public let webpageURL: UnsafeRawBufferPointer?
    /// The array of required keys (text), nil when absent.
    public let requiredUserInfoKeysValue: CBORValue?
    /// The userInfo map, nil when absent.
    public let userInfoValue: CBORValue?

    /// Required userInfo keys, each a `.text`, in encoded order.
    public var requiredUserInfoKeys: CBORElements {
        requiredUserInfoKeysValue?.elements ?? CBORElements(base: bytes, offset: 0, remaining: 0)
    }

    /// userInfo's entries, keys `.text`, in key order.
    public var userInfo: CBOREntries {
        userInfoValue?.entries ?? CBOREntries(base: bytes, offset: 0, remaining: 0)
    }

    /// The userInfo value under `key`, nil when absent.
    public func userInfo(_ key: some StringProtocol) -> CBORValue? { userInfoValue?[key] }

    /// Larger than the 3 KB a device should aim for (still within the configured hard cap):
    /// worth a log line naming the activity type.
    public var exceedsRecommendedSize: Bool { bytes.count > PayloadLimits.recommendedMaxBytes }
}

// MARK: - Validation

public enum ActivityPayload {}

extension ActivityPayload {
    public static let version = 1

    // Top-level keys (§2).
    public static let keyVersion: UInt64 = 0
    public static let keyActivityType: UInt64 = 1
    public static let keyTitle: UInt64 = 2
    public static let keyWebpageURL: UInt64 = 3
    public static let keyRequiredUserInfoKeys: UInt64 = 4
    public static let keyUserInfo: UInt64 = 5

    /// Validates untrusted bytes as a whole payload and returns a borrowed view. Total: any
    /// input gives a view or a `WireError` naming the byte and the rule; no trap, no allocation.
    public static func validate(_ bytes: UnsafeRawBufferPointer,
                                limits: PayloadLimits = .default) throws(WireError) -> ActivityPayloadView {
        // Size first, before a byte is read.
        guard bytes.count <= limits.maxBytes else { throw .malformed(at: limits.maxBytes, .payloadTooLarge) }
        let v = Validator(base: bytes, limits: limits)
        var r = ByteReader(bytes)
        let head = try r.readCBORHead()
        guard head.major == CBOR.majorMap else { throw .malformed(at: 0, .payloadNotMap) }
        guard head.argument <= UInt64(limits.maxItemsPerContainer) else { throw .malformed(at: 0, .cborTooManyItems) }

        var version: Int? = nil
        var activityType: UnsafeRawBufferPointer? = nil
        var title: UnsafeRawBufferPointer? = nil
        var url: UnsafeRawBufferPointer? = nil
        var required: CBORValue? = nil
        var userInfo: CBORValue? = nil
        var previous: UInt64? = nil

        for _ in 0 ..< Int(head.argument) {
            let keyAt = r.offset
            let key = try r.readCBORHead()
            // v1 keys are all unsigned: any other type is the first thing wrong, before order.
            guard key.major == CBOR.majorUnsigned else { throw .malformed(at: keyAt, .payloadKeyType) }
            if let p = previous {
                // Unsigned keys' encodings sort as their values do (preferred serialization).
                if key.argument == p { throw .malformed(at: keyAt, .cborDuplicateKey) }
                if key.argument < p { throw .malformed(at: keyAt, .cborUnsortedKeys) }
            }
            previous = key.argument
            let at = r.offset
            switch key.argument {
            case keyVersion:
                let h = try r.readCBORHead()
                guard h.major == CBOR.majorUnsigned else { throw .malformed(at: at, .payloadFieldType) }
                guard h.argument == UInt64(ActivityPayload.version) else { throw .unsupported(at: at, value: h.argument) }
                version = Int(h.argument)
            case keyActivityType:
                let t = try v.text(&r, field: true)
                try checkActivityType(t, at: r.offset - t.count)
                activityType = t
            case keyTitle:
                let t = try v.text(&r, field: true)
                guard t.count > 0 else { throw .malformed(at: at, .payloadEmptyField) }
                title = t
            case keyWebpageURL:
                let h = try r.peekTagged(at: at)
                guard h == CBOR.tagURI else { throw .malformed(at: at, .payloadFieldType) }
                let u = try v.value(&r, depth: 1)
                guard u.kind == .url, let utf8 = u.utf8 else { throw .malformed(at: at, .payloadFieldType) }
                try checkWebURL(utf8, at: u.contentOffset)
                url = utf8
            case keyRequiredUserInfoKeys:
                required = try v.requiredKeys(&r)
            case keyUserInfo:
                userInfo = try v.userInfo(&r, required: required)
            default:
                // Unknown keys are rejected in v1: a new field is a new version (§2).
                throw .unsupported(at: keyAt, value: key.argument)
            }
        }
        try r.requireEnd()
        guard let version, let activityType else { throw .malformed(at: 0, .payloadMissingField) }
        // Required keys with no userInfo at all: every one of them is missing.
        if userInfo == nil, var keys = required?.elements, let first = keys.next() {
            throw .malformed(at: first.offset, .payloadRequiredKeyMissing)
        }
        return ActivityPayloadView(bytes: bytes, version: version, activityType: activityType, title: title,
                                   webpageURL: url, requiredUserInfoKeysValue: required, userInfoValue: userInfo)
    }

    /// True when `type` is an activity type as §2.1 has it (what `activity-types:` holds).
    public static func isActivityType(_ type: String) -> Bool {
        var t = type
        return t.withUTF8 { p -> Bool in
            do throws(WireError) { try checkActivityType(UnsafeRawBufferPointer(p), at: 0); return true } catch { return false }
        }
    }

    /// Reverse-DNS (§2.1): two or more non-empty labels of [A-Za-z0-9_-] joined by '.'.
    static func checkActivityType(_ t: UnsafeRawBufferPointer, at: Int) throws(WireError) {
        var labels = 1, labelLength = 0
        for i in 0 ..< t.count {
            let b = t[i]
            if b == UInt8(ascii: ".") {
                guard labelLength > 0 else { throw .malformed(at: at + i, .payloadActivityType) }
                labels += 1
                labelLength = 0
                continue
            }
            let ok = (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
            guard ok else { throw .malformed(at: at + i, .payloadActivityType) }
            labelLength += 1
        }
        guard labels >= 2, labelLength > 0 else { throw .malformed(at: at + t.count, .payloadActivityType) }
    }

    /// The URI syntax every tag 32 must have (RFC 3986 §3.1): scheme = ALPHA *( ALPHA / DIGIT /
    /// "+" / "-" / "." ) then ':'; and no byte a URI never holds raw (controls, space, DEL).
    /// Returns the scheme's length.
    static func checkURI(_ u: UnsafeRawBufferPointer, at: Int) throws(WireError) -> Int {
        var scheme: Int? = nil
        for i in 0 ..< u.count {
            let b = u[i]
            guard b > 0x20 && b != 0x7F else { throw .malformed(at: at + i, .cborBadURL) }
            guard scheme == nil else { continue }
            let alpha = (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
            let digit = b >= 0x30 && b <= 0x39
            if b == UInt8(ascii: ":") && i > 0 { scheme = i; continue }
            guard alpha || (i > 0 && (digit || b == UInt8(ascii: "+") || b == UInt8(ascii: "-") || b == UInt8(ascii: "."))) else {
                throw .malformed(at: at + i, .cborBadURL)
            }
        }
        guard let scheme else { throw .malformed(at: at + u.count, .cborBadURL) }
        return scheme
    }

    /// The webpage URL (§2.2): a URI whose scheme is http or https in any case, then "//"
    /// and a non-empty authority, as NSUserActivity's webpageURL demands.
    static func checkWebURL(_ u: UnsafeRawBufferPointer, at: Int) throws(WireError) {
        let schemeLength = try checkURI(u, at: at)
        func lower(_ i: Int) -> UInt8 { u[i] | 0x20 }  // ASCII letters only: checkURI proved it
        let isHTTP = schemeLength == 4 && lower(0) == 0x68 && lower(1) == 0x74 && lower(2) == 0x74 && lower(3) == 0x70
        let isHTTPS = schemeLength == 5 && lower(0) == 0x68 && lower(1) == 0x74 && lower(2) == 0x74
            && lower(3) == 0x70 && lower(4) == 0x73
        guard isHTTP || isHTTPS else { throw .malformed(at: at, .payloadURLScheme) }
        let rest = schemeLength + 1
        guard u.count >= rest + 3, u[rest] == UInt8(ascii: "/"), u[rest + 1] == UInt8(ascii: "/"),
              u[rest + 2] != UInt8(ascii: "/") else {
            throw .malformed(at: at + rest, .payloadURLNoHost)
        }
    }

    /// The first date RFC 3339 can write, 0001-01-01T00:00:00Z, and one past the last,
    /// 10000-01-01T00:00:00Z, in Unix seconds (§3.6).
    static let minDateSeconds: Int64 = -62_135_596_800
    static let endDateSeconds: Int64 = 253_402_300_800
}

extension ByteReader {
    /// The tag number of the head at the cursor, or nil when it is not a tag; does not move.
    mutating func peekTagged(at: Int) throws(WireError) -> UInt64? {
        let save = offset
        let h = try readCBORHead()
        _offset = save
        return h.major == CBOR.majorTag ? h.argument : nil
    }
}

/// The walk over userInfo values. Recursion is bounded: each level is one more enclosing
/// container, checked against `limits.maxDepth` (≤ 64) before descending; a tag's content is
/// checked to be a non-tag before it is read, so tags cannot nest to dodge the cap.
struct Validator {
    let base: UnsafeRawBufferPointer
    let limits: PayloadLimits

    /// A text string (UTF-8 checked) at the cursor; `field` names a top-level field, whose
    /// wrong type is `payloadFieldType` rather than a userInfo rule.
    func text(_ r: inout ByteReader, field: Bool) throws(WireError) -> UnsafeRawBufferPointer {
        let at = r.offset
        let h = try r.readCBORHead()
        guard h.major == CBOR.majorText else {
            r._offset = at
            throw .malformed(at: at, field ? .payloadFieldType : .cborMapKeyNotText)
        }
        let content = try stringContent(&r, h)
        if let bad = UTF8Check.firstInvalid(content) { throw .malformed(at: r.offset - content.count + bad, .cborBadUTF8) }
        return content
    }

    func stringContent(_ r: inout ByteReader, _ h: CBORHead) throws(WireError) -> UnsafeRawBufferPointer {
        guard h.argument <= UInt64(r.remaining) else {
            let short = h.argument - UInt64(r.remaining)
            throw .truncated(at: r.offset, need: short > UInt64(Int.max) ? Int.max : Int(short))
        }
        return try r.readBytes(Int(h.argument))
    }

    /// Key 4 (§2.3): a non-empty array of text, strictly increasing by encoded bytes.
    func requiredKeys(_ r: inout ByteReader) throws(WireError) -> CBORValue {
        let at = r.offset
        let h = try r.readCBORHead()
        guard h.major == CBOR.majorArray else { r._offset = at; throw .malformed(at: at, .payloadFieldType) }
        guard h.argument > 0 else { throw .malformed(at: at, .payloadEmptyField) }
        guard h.argument <= UInt64(limits.maxItemsPerContainer) else { throw .malformed(at: at, .cborTooManyItems) }
        let content = r.offset
        var previous: UnsafeRawBufferPointer? = nil
        for _ in 0 ..< Int(h.argument) {
            let keyAt = r.offset
            _ = try text(&r, field: true)
            let encoded = UnsafeRawBufferPointer(rebasing: base[keyAt ..< r.offset])
            if let p = previous, CBOR.compare(p, encoded) >= 0 { throw .malformed(at: keyAt, .payloadRequiredKeysOrder) }
            previous = encoded
        }
        return CBORValue(kind: .array, base: base, offset: at, end: r.offset, contentOffset: content, argument: h.argument)
    }

    /// Key 5 (§3): a non-empty map of text keys; every required key must be among them.
    /// Both lists are sorted by encoded bytes, so one merge pass checks inclusion.
    func userInfo(_ r: inout ByteReader, required: CBORValue?) throws(WireError) -> CBORValue {
        let at = r.offset
        let h = try r.readCBORHead()
        guard h.major == CBOR.majorMap else { r._offset = at; throw .malformed(at: at, .payloadFieldType) }
        guard h.argument > 0 else { throw .malformed(at: at, .payloadEmptyField) }
        r._offset = at
        var pending = required?.elements ?? CBORElements(base: base, offset: 0, remaining: 0)
        var want = pending.next()
        let map = try value(&r, depth: 1) { key throws(WireError) in
            // Both strictly increasing: a wanted key below this one can no longer appear.
            guard let w = want else { return }
            let c = CBOR.compare(w.encoded, key)
            if c < 0 { throw .malformed(at: w.offset, .payloadRequiredKeyMissing) }
            if c == 0 { want = pending.next() }
        }
        if let w = want { throw .malformed(at: w.offset, .payloadRequiredKeyMissing) }
        return map
    }

    /// One userInfo value at the cursor. `depth` counts the containers around it.
    /// `onKey`, for the map at the cursor only, sees each key's encoding in order.
    func value(_ r: inout ByteReader, depth: Int,
               onKey: (UnsafeRawBufferPointer) throws(WireError) -> Void = { _ throws(WireError) in }) throws(WireError) -> CBORValue {
        let at = r.offset
        let h = try r.readCBORHead()
        switch h.major {
        case CBOR.majorUnsigned, CBOR.majorNegative:
            // NSNumber's integers are 64-bit; beyond Int64 is out of the data model (§3.3).
            guard h.argument <= UInt64(Int64.max) else { throw .malformed(at: at, .cborIntegerRange) }
            return CBORValue(kind: .int, base: base, offset: at, end: r.offset, contentOffset: r.offset,
                             argument: h.argument, negative: h.major == CBOR.majorNegative)
        case CBOR.majorBytes:
            let content = try stringContent(&r, h)
            return CBORValue(kind: .data, base: base, offset: at, end: r.offset, contentOffset: r.offset - content.count,
                             argument: h.argument)
        case CBOR.majorText:
            r._offset = at
            let content = try text(&r, field: false)
            return CBORValue(kind: .text, base: base, offset: at, end: r.offset, contentOffset: r.offset - content.count,
                             argument: h.argument)
        case CBOR.majorArray:
            try enter(h, depth: depth)
            let content = r.offset
            for _ in 0 ..< Int(h.argument) { _ = try value(&r, depth: depth + 1) }
            return CBORValue(kind: .array, base: base, offset: at, end: r.offset, contentOffset: content, argument: h.argument)
        case CBOR.majorMap:
            try enter(h, depth: depth)
            let content = r.offset
            var previous: UnsafeRawBufferPointer? = nil
            for _ in 0 ..< Int(h.argument) {
                let keyAt = r.offset
                _ = try text(&r, field: false)
                let key = UnsafeRawBufferPointer(rebasing: base[keyAt ..< r.offset])
                if let p = previous {
                    let c = CBOR.compare(p, key)
                    if c == 0 { throw .malformed(at: keyAt, .cborDuplicateKey) }
                    if c > 0 { throw .malformed(at: keyAt, .cborUnsortedKeys) }
                }
                previous = key
                try onKey(key)
                _ = try value(&r, depth: depth + 1)
            }
            return CBORValue(kind: .map, base: base, offset: at, end: r.offset, contentOffset: content, argument: h.argument)
        case CBOR.majorTag:
            return try tagged(&r, h, depth: depth)
        default:
            return try simple(&r, h)
        }
    }

    private func enter(_ h: CBORHead, depth: Int) throws(WireError) {
        guard depth + 1 <= limits.maxDepth else { throw .malformed(at: h.offset, .cborTooDeep) }
        guard h.argument <= UInt64(limits.maxItemsPerContainer) else { throw .malformed(at: h.offset, .cborTooManyItems) }
    }

    /// Tags 1, 32, 258 (§3.6). The content's head is peeked and its major type checked
    /// before anything recurses.
    private func tagged(_ r: inout ByteReader, _ tag: CBORHead, depth: Int) throws(WireError) -> CBORValue {
        let at = tag.offset
        // The tag number first: an unknown tag is named even when its content is cut short.
        guard tag.argument == CBOR.tagEpochDate || tag.argument == CBOR.tagURI || tag.argument == CBOR.tagSet else {
            throw .malformed(at: at, .cborDisallowedTag)
        }
        let innerAt = r.offset
        let inner = try r.readCBORHead()
        switch tag.argument {
        case CBOR.tagEpochDate:
            if inner.major == CBOR.majorUnsigned || inner.major == CBOR.majorNegative {
                guard inner.argument <= UInt64(Int64.max) else { throw .malformed(at: innerAt, .cborBadDate) }
                let s = CBORValue.signed(inner.argument, negative: inner.major == CBOR.majorNegative)
                guard s >= ActivityPayload.minDateSeconds, s < ActivityPayload.endDateSeconds else {
                    throw .malformed(at: innerAt, .cborBadDate)
                }
                return CBORValue(kind: .date, base: base, offset: at, end: r.offset, contentOffset: r.offset,
                                 argument: inner.argument, negative: inner.major == CBOR.majorNegative)
            }
            guard inner.isFloat else { throw .malformed(at: innerAt, .cborBadDate) }
            let d = try checkedFloat(inner)
            // Whole seconds are integers (one encoding per date); the range keeps RFC 3339
            // rendering within four-digit years after rounding to microseconds (§4).
            guard d.isFinite, !CBOR.isIntegral(d),
                  d >= Double(ActivityPayload.minDateSeconds), d < Double(ActivityPayload.endDateSeconds - 1) else {
                throw .malformed(at: innerAt, .cborBadDate)
            }
            return CBORValue(kind: .date, base: base, offset: at, end: r.offset, contentOffset: r.offset,
                             argument: d.bitPattern, floatForm: true)
        case CBOR.tagURI:
            guard inner.major == CBOR.majorText else { throw .malformed(at: innerAt, .cborBadURL) }
            r._offset = innerAt
            let content = try text(&r, field: false)
            _ = try ActivityPayload.checkURI(content, at: r.offset - content.count)
            return CBORValue(kind: .url, base: base, offset: at, end: r.offset, contentOffset: r.offset - content.count,
                             argument: inner.argument)
        case CBOR.tagSet:
            guard inner.major == CBOR.majorArray else { throw .malformed(at: innerAt, .cborBadSet) }
            try enter(inner, depth: depth)
            let content = r.offset
            var previous: UnsafeRawBufferPointer? = nil
            for _ in 0 ..< Int(inner.argument) {
                let e = try value(&r, depth: depth + 1)
                if let p = previous {
                    let c = CBOR.compare(p, e.encoded)
                    if c == 0 { throw .malformed(at: e.offset, .cborDuplicateSetElement) }
                    if c > 0 { throw .malformed(at: e.offset, .cborUnsortedSet) }
                }
                previous = e.encoded
            }
            return CBORValue(kind: .set, base: base, offset: at, end: r.offset, contentOffset: content,
                             argument: inner.argument)
        default:
            throw .malformed(at: at, .cborDisallowedTag)
        }
    }

    private func simple(_ r: inout ByteReader, _ h: CBORHead) throws(WireError) -> CBORValue {
        switch h.info {
        case CBOR.simpleFalse, CBOR.simpleTrue:
            return CBORValue(kind: .bool, base: base, offset: h.offset, end: r.offset, contentOffset: r.offset,
                             argument: h.info == CBOR.simpleTrue ? 1 : 0)
        case CBOR.simpleNull:
            return CBORValue(kind: .null, base: base, offset: h.offset, end: r.offset, contentOffset: r.offset, argument: 0)
        case 25, 26, 27:
            let d = try checkedFloat(h)
            return CBORValue(kind: .double, base: base, offset: h.offset, end: r.offset, contentOffset: r.offset,
                             argument: d.bitPattern)
        default:
            throw .malformed(at: h.offset, .cborDisallowedSimple)
        }
    }

    /// RFC 8949 §4.2.2: the shortest float that keeps the value; the one NaN is 0xF97E00.
    private func checkedFloat(_ h: CBORHead) throws(WireError) -> Double {
        let d = CBORValue.floatValue(h)
        switch h.info {
        case 25:
            if d.isNaN && h.argument != UInt64(CBOR.canonicalNaNHalfBits) { throw .malformed(at: h.offset, .cborNonCanonicalNaN) }
        case 26:
            if d.isNaN { throw .malformed(at: h.offset, .cborNonCanonicalNaN) }
            if CBOR.halfBits(exactly: d) != nil { throw .malformed(at: h.offset, .cborNonPreferredFloat) }
        default:
            if d.isNaN { throw .malformed(at: h.offset, .cborNonCanonicalNaN) }
            if Double(Float(d)) == d { throw .malformed(at: h.offset, .cborNonPreferredFloat) }
        }
        return d
    }
}

// MARK: - Encoding (devices, the simulator, tests)

/// A userInfo value as Swift values: the kinds NSUserActivity allows (§3). Used to build
/// payloads; decoding never produces these unless asked (`init(_: CBORValue)`).
public indirect enum UserInfoValue: Equatable, Sendable {
    case array([UserInfoValue])
    case data([UInt8])
    /// Seconds since 1970-01-01T00:00:00Z; whole seconds are written as an integer.
    case date(Double)
    case dictionary([String: UserInfoValue])
    case null
    case int(Int64)
    case double(Double)
    case bool(Bool)
    /// Written sorted by encoded bytes with duplicates dropped, as a set means.
    case set([UserInfoValue])
    case string(String)
    /// An absolute URI (any scheme; only the webpage URL must be http or https).
    case url(String)
}

/// An activity's state as Swift values, for the originating side. `encode` produces the one
/// deterministic encoding and checks it with the same validator a receiver runs.
public struct ActivityPayloadContent: Equatable, Sendable {
    public var activityType: String
    /// nil and "" are the same: no title.
    public var title: String?
    public var webpageURL: String?
    public var requiredUserInfoKeys: Set<String>
    public var userInfo: [String: UserInfoValue]

    public init(activityType: String, title: String? = nil, webpageURL: String? = nil,
                requiredUserInfoKeys: Set<String> = [], userInfo: [String: UserInfoValue] = [:]) {
        self.activityType = activityType
        self.title = title
        self.webpageURL = webpageURL
        self.requiredUserInfoKeys = requiredUserInfoKeys
        self.userInfo = userInfo
    }

    /// The encoding, validated against `limits`. Errors are the validator's, with offsets
    /// into the encoding (e.g. `.payloadURLScheme` for an ftp webpage URL).
    public func encoded(limits: PayloadLimits = .default) throws(WireError) -> [UInt8] {
        var b = CBORBuilder()
        try b.payload(self, limits: limits)
        let bytes = b.bytes
        let failure: WireError? = bytes.withUnsafeBytes { raw -> WireError? in
            do throws(WireError) { _ = try ActivityPayload.validate(raw, limits: limits); return nil } catch { return error }
        }
        if let failure { throw failure }
        return bytes
    }

    /// Writes the encoding into a caller-owned buffer: measured and validated first, then
    /// one `reserve` (which throws `.noRoom`) and the copy.
    public func encode(into w: inout ByteWriter, limits: PayloadLimits = .default) throws(WireError) {
        let bytes = try encoded(limits: limits)
        try w.reserve(bytes.count)
        bytes.withUnsafeBytes { w.write($0) }
    }

    /// Copies a validated view into Swift values (allocates; for tests and devices, not for
    /// the gateway's hot path, which works on the view).
    public init(_ view: ActivityPayloadView) {
        activityType = String(decoding: view.activityType, as: UTF8.self)
        title = view.title.map { String(decoding: $0, as: UTF8.self) }
        webpageURL = view.webpageURL.map { String(decoding: $0, as: UTF8.self) }
        var keys = Set<String>()
        for k in view.requiredUserInfoKeys { keys.insert(String(decoding: k.utf8 ?? .init(start: nil, count: 0), as: UTF8.self)) }
        requiredUserInfoKeys = keys
        var info: [String: UserInfoValue] = [:]
        for e in view.userInfo { info[String(decoding: e.key.utf8 ?? .init(start: nil, count: 0), as: UTF8.self)] = UserInfoValue(e.value) }
        userInfo = info
    }
}

extension UserInfoValue {
    /// Copies a validated value into Swift values (allocates; tests and devices).
    public init(_ v: CBORValue) {
        func string(_ p: UnsafeRawBufferPointer?) -> String { String(decoding: p ?? .init(start: nil, count: 0), as: UTF8.self) }
        switch v.kind {
        case .int: self = .int(v.int ?? 0)
        case .double: self = .double(v.double ?? 0)
        case .bool: self = .bool(v.bool ?? false)
        case .null: self = .null
        case .text: self = .string(string(v.utf8))
        case .url: self = .url(string(v.utf8))
        case .data: self = .data(Array(v.data ?? .init(start: nil, count: 0)))
        case .date: self = .date(v.dateSeconds ?? 0)
        case .array: self = .array(v.elements.map(UserInfoValue.init))
        case .set: self = .set(v.elements.map(UserInfoValue.init))
        case .map:
            var d: [String: UserInfoValue] = [:]
            for e in v.entries { d[string(e.key.utf8)] = UserInfoValue(e.value) }
            self = .dictionary(d)
        }
    }
}

/// Builds deterministic CBOR in a growing array (the encoder side may allocate: it runs on
/// devices and in tests, and its output is then copied into the caller's buffer once).
struct CBORBuilder {
    var bytes: [UInt8] = []

    mutating func head(_ major: UInt8, _ argument: UInt64) {
        let m = major << 5
        switch CBOR.headLength(argument: argument) {
        case 1: bytes.append(m | UInt8(truncatingIfNeeded: argument))
        case 2: bytes.append(m | 24); bytes.append(UInt8(truncatingIfNeeded: argument))
        case 3: bytes.append(m | 25); big(argument, 2)
        case 5: bytes.append(m | 26); big(argument, 4)
        default: bytes.append(m | 27); big(argument, 8)
        }
    }

    private mutating func big(_ v: UInt64, _ n: Int) {
        for i in stride(from: n - 1, through: 0, by: -1) { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }

    mutating func text(_ s: String) {
        head(CBOR.majorText, UInt64(s.utf8.count))
        bytes.append(contentsOf: s.utf8)
    }

    mutating func int(_ v: Int64) {
        // -1 - v == ~v for negatives (RFC 8949 §3.1, major type 1).
        if v >= 0 { head(CBOR.majorUnsigned, UInt64(v)) } else { head(CBOR.majorNegative, UInt64(~v)) }
    }

    mutating func float(_ d: Double) {
        if d.isNaN { bytes.append(0xF9); big(UInt64(CBOR.canonicalNaNHalfBits), 2) }
        else if let h = CBOR.halfBits(exactly: d) { bytes.append(0xF9); big(UInt64(h), 2) }
        else if Double(Float(d)) == d { bytes.append(0xFA); big(UInt64(Float(d).bitPattern), 4) }
        else { bytes.append(0xFB); big(d.bitPattern, 8) }
    }

    /// Text keys sort by encoded bytes exactly as by (UTF-8 length, UTF-8 bytes): the head
    /// grows with the length (RFC 8949 §4.2.1 and §4.2.3's note on length-first order).
    static func keyOrder(_ a: String, _ b: String) -> Bool {
        let x = a.utf8.count, y = b.utf8.count
        return x != y ? x < y : a.utf8.lexicographicallyPrecedes(b.utf8)
    }

    mutating func payload(_ p: ActivityPayloadContent, limits: PayloadLimits) throws(WireError) {
        let title = p.title.flatMap { $0.isEmpty ? nil : $0 }
        let count = 2 + (title == nil ? 0 : 1) + (p.webpageURL == nil ? 0 : 1)
            + (p.requiredUserInfoKeys.isEmpty ? 0 : 1) + (p.userInfo.isEmpty ? 0 : 1)
        head(CBOR.majorMap, UInt64(count))
        head(CBOR.majorUnsigned, ActivityPayload.keyVersion); head(CBOR.majorUnsigned, UInt64(ActivityPayload.version))
        head(CBOR.majorUnsigned, ActivityPayload.keyActivityType); text(p.activityType)
        if let title { head(CBOR.majorUnsigned, ActivityPayload.keyTitle); text(title) }
        if let u = p.webpageURL {
            head(CBOR.majorUnsigned, ActivityPayload.keyWebpageURL); head(CBOR.majorTag, CBOR.tagURI); text(u)
        }
        if !p.requiredUserInfoKeys.isEmpty {
            head(CBOR.majorUnsigned, ActivityPayload.keyRequiredUserInfoKeys)
            head(CBOR.majorArray, UInt64(p.requiredUserInfoKeys.count))
            for k in p.requiredUserInfoKeys.sorted(by: CBORBuilder.keyOrder) { text(k) }
        }
        if !p.userInfo.isEmpty {
            head(CBOR.majorUnsigned, ActivityPayload.keyUserInfo)
            try map(p.userInfo, depth: 1, limits: limits)
        }
    }

    mutating func map(_ d: [String: UserInfoValue], depth: Int, limits: PayloadLimits) throws(WireError) {
        guard depth + 1 <= limits.maxDepth else { throw .malformed(at: bytes.count, .cborTooDeep) }
        head(CBOR.majorMap, UInt64(d.count))
        for k in d.keys.sorted(by: CBORBuilder.keyOrder) {
            text(k)
            // Proof: k came from d.keys.
            try value(d[k]!, depth: depth + 1, limits: limits)
        }
    }

    /// `depth` counts the containers around `v`; checked here so a deep Swift value fails
    /// with `.cborTooDeep` before it is walked any further.
    mutating func value(_ v: UserInfoValue, depth: Int, limits: PayloadLimits) throws(WireError) {
        switch v {
        case .int(let i): int(i)
        case .double(let d): float(d)
        case .bool(let b): head(CBOR.majorSimple, UInt64(b ? CBOR.simpleTrue : CBOR.simpleFalse))
        case .null: head(CBOR.majorSimple, UInt64(CBOR.simpleNull))
        case .string(let s): text(s)
        case .url(let s): head(CBOR.majorTag, CBOR.tagURI); text(s)
        case .data(let d): head(CBOR.majorBytes, UInt64(d.count)); bytes.append(contentsOf: d)
        case .date(let d):
            head(CBOR.majorTag, CBOR.tagEpochDate)
            // Whole seconds as an integer (§3.6); -0.0 is 0. Out-of-range values are left to
            // the validator, which names them.
            if CBOR.isIntegral(d), d >= -0x1p63, d < 0x1p63 { int(Int64(d)) } else { float(d) }
        case .array(let a):
            guard depth + 1 <= limits.maxDepth else { throw .malformed(at: bytes.count, .cborTooDeep) }
            head(CBOR.majorArray, UInt64(a.count))
            for e in a { try value(e, depth: depth + 1, limits: limits) }
        case .dictionary(let d):
            try map(d, depth: depth, limits: limits)
        case .set(let s):
            guard depth + 1 <= limits.maxDepth else { throw .malformed(at: bytes.count, .cborTooDeep) }
            var encoded: [[UInt8]] = []
            for e in s {
                var b = CBORBuilder()
                try b.value(e, depth: depth + 1, limits: limits)
                encoded.append(b.bytes)
            }
            encoded.sort { $0.lexicographicallyPrecedes($1) }
            var unique: [[UInt8]] = []
            for e in encoded where unique.last != e { unique.append(e) }
            head(CBOR.majorTag, CBOR.tagSet)
            head(CBOR.majorArray, UInt64(unique.count))
            for e in unique { bytes.append(contentsOf: e) }
        }
    }
}

// MARK: - JSON for MQTT consumers (docs/payload.md §4)

extension ActivityPayloadView {
    /// Renders the payload as one JSON object with a fixed set of members, absent fields as
    /// `null` / `[]` / `{}`, so a Home Assistant template never meets a missing key:
    /// `{"version":1,"activityType":…,"title":…,"webpageURL":…,"requiredUserInfoKeys":[…],"userInfo":{…}}`.
    public func renderJSON(into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("version"); try w.int(Int64(version))
        try w.key("activityType"); try w.string(utf8: activityType)
        try w.key("title")
        if let title { try w.string(utf8: title) } else { try w.null() }
        try w.key("webpageURL")
        if let webpageURL { try w.string(utf8: webpageURL) } else { try w.null() }
        try w.key("requiredUserInfoKeys")
        try w.beginArray()
        for k in requiredUserInfoKeys { try k.renderJSON(into: &w) }
        try w.endArray()
        try w.key("userInfo")
        if let userInfoValue { try userInfoValue.renderJSON(into: &w) } else { try w.beginObject(); try w.endObject() }
        try w.endObject()
    }
}

extension CBORValue {
    /// One value as JSON (docs/payload.md §4): data as base64, date as RFC 3339 UTC, URL as
    /// a string, set as an array in canonical order, NaN/±infinity as null. Recursion is as
    /// deep as the validated nesting (≤ PayloadLimits.maxSupportedDepth).
    public func renderJSON(into w: inout JSONWriter) throws(WireError) {
        switch kind {
        case .int: try w.int(int ?? 0)
        case .double: try w.double(double ?? 0)
        case .bool: try w.bool(bool ?? false)
        case .null: try w.null()
        case .text, .url: try w.string(utf8: utf8 ?? UnsafeRawBufferPointer(start: nil, count: 0))
        case .data: try w.base64(data ?? UnsafeRawBufferPointer(start: nil, count: 0))
        case .date:
            var text = RFC3339()
            if let whole = dateInteger { text.format(seconds: whole, micros: nil) } else {
                let (s, us) = RFC3339.split(dateSeconds ?? 0)
                text.format(seconds: s, micros: us)
            }
            try text.withBytes { b throws(WireError) in try w.string(utf8: b) }
        case .array, .set:
            try w.beginArray()
            for e in elements { try e.renderJSON(into: &w) }
            try w.endArray()
        case .map:
            try w.beginObject()
            for e in entries {
                try w.key(utf8: e.key.utf8 ?? UnsafeRawBufferPointer(start: nil, count: 0))
                try e.value.renderJSON(into: &w)
            }
            try w.endObject()
        }
    }
}

/// "YYYY-MM-DDTHH:MM:SSZ" or "YYYY-MM-DDTHH:MM:SS.ffffffZ" (RFC 3339 §5.6), on the stack.
/// The validator keeps dates within years 0001–9999.
struct RFC3339 {
    var bytes: InlineArray<27, UInt8> = .init(repeating: 0)
    var count = 0

    /// Whole seconds (floor) and microseconds (0…999 999) of a fractional date, rounding
    /// the fraction half-to-even as Python's datetime.fromtimestamp does.
    /// (No `rounded(_:)`: it needs libm, see `CBOR.isIntegral`.)
    static func split(_ d: Double) -> (Int64, Int64) {
        // The validator bounded d to ±2^38, so Int64 truncation is exact and cannot trap.
        var whole = Int64(d)
        let x = (d - Double(whole)) * 1_000_000  // d - whole is exact; |x| < 10^6
        var micros = Int64(x)
        let rest = x - Double(micros)             // exact, in (-1, 1)
        if rest > 0.5 || (rest == 0.5 && micros & 1 != 0) { micros += 1 }
        if rest < -0.5 || (rest == -0.5 && micros & 1 != 0) { micros -= 1 }
        if micros < 0 { micros += 1_000_000; whole -= 1 }
        if micros >= 1_000_000 { micros -= 1_000_000; whole += 1 }
        return (whole, micros)
    }

    mutating func format(seconds: Int64, micros: Int64?) {
        // Floor division into days and seconds of day.
        var days = seconds / 86_400, sod = seconds % 86_400
        if sod < 0 { sod += 86_400; days -= 1 }
        // Civil date from days since 1970-01-01 in the proleptic Gregorian calendar: shift to
        // eras of 400 years starting 0000-03-01, so leap days fall at the end of a year.
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097                                   // day of era, 0…146096
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365  // year of era, 0…399
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)             // day of year from March 1
        let mp = (5 * doy + 2) / 153                                  // month from March, 0…11
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        digits(year, 4); put("-"); digits(month, 2); put("-"); digits(day, 2)
        put("T"); digits(sod / 3600, 2); put(":"); digits(sod / 60 % 60, 2); put(":"); digits(sod % 60, 2)
        if let micros { put("."); digits(micros, 6) }
        put("Z")
    }

    private mutating func put(_ c: Unicode.Scalar) {
        bytes[count] = UInt8(ascii: c)
        count += 1
    }

    private mutating func digits(_ v: Int64, _ width: Int) {
        var div: Int64 = 1
        for _ in 1 ..< width { div *= 10 }
        var x = v
        while div > 0 {
            bytes[count] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: x / div)
            x %= div
            div /= 10
            count += 1
        }
    }

    func withBytes(_ body: (UnsafeRawBufferPointer) throws(WireError) -> Void) throws(WireError) {
        var copy = bytes
        let n = count
        var span = copy.mutableSpan
        // withUnsafeMutableBytes rethrows untyped; carry the typed error out as a value.
        let failure: WireError? = span.withUnsafeMutableBytes { raw -> WireError? in
            do throws(WireError) { try body(UnsafeRawBufferPointer(rebasing: raw[..<n])); return nil } catch { return error }
        }
        if let failure { throw failure }
    }
}
