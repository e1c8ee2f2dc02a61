// The schema checks both of Baton's YAML readers make (the config, docs/config.md; scenarios,
// docs/simulator.md "Scenarios"): a mapping's keys against the known ones, a key given twice,
// a value of the wrong shape, text and booleans. Each problem is collected, not thrown, so one
// run shows every mistake. The readers say a few things their own way — how a mapping and a
// quoted value read, what an unknown key suggests — and pass those in.

/// One `key: value` of a mapping whose keys the schema knows.
public struct YAMLEntry {
    /// The dotted key or key path errors name (`broker.keepalive`, `devices[0].script[1].walk`).
    public let key: String
    public let keyNode: YAMLNode
    public let value: YAMLNode

    public init(key: String, keyNode: YAMLNode, value: YAMLNode) {
        self.key = key; self.keyNode = keyNode; self.value = value
    }

    public var keyLine: Int { keyNode.line }
}

/// A mapping's known entries by key name. Absent, empty and `~` values read as absent.
public struct YAMLSection {
    public let node: YAMLNode
    /// Every known key given, null or not (a null value is still a key written).
    public var entries: [String: YAMLEntry] = [:]

    public init(node: YAMLNode) { self.node = node }

    public subscript(name: String) -> YAMLEntry? {
        guard let e = entries[name], !YAMLText.isNull(e.value) else { return nil }
        return e
    }
}

/// Collects a file's problems while a reader walks its nodes.
public struct YAMLReader {
    public let file: String
    public private(set) var errors: [YAMLFileError] = []
    /// How a reader shows a value in a message (`"101"`).
    let quote: (String) -> String
    /// How a reader names a mapping in "got …" (`a section of keys`).
    let mappingName: String

    public init(file: String, mappingName: String, quote: @escaping (String) -> String) {
        self.file = file; self.mappingName = mappingName; self.quote = quote
    }

    public mutating func report(line: Int?, _ key: String, _ message: String) {
        errors.append(YAMLFileError(file: file, line: line, key: key, message: message))
    }

    /// At `node`'s line; nil: the file as a whole.
    public mutating func report(_ node: YAMLNode?, _ key: String, _ message: String) {
        report(line: node?.line, key, message)
    }

    /// What was written, for "got …": the scalar quoted, or what kind of collection.
    public func describe(_ node: YAMLNode) -> String {
        switch node.kind {
        case .scalar(let s): quote(s.string)
        case .sequence: "a list"
        case .mapping: mappingName
        }
    }

    /// Checks a mapping's keys against `known`: a key that is not a scalar, an unknown key
    /// (reported at the key and with the message `unknown` gives for its name) and a key given
    /// twice are reported and left out. nil when `node` is not a mapping, reported as
    /// `expected \(expected), got …`; with `nullIsEmpty`, a null `node` is an empty section.
    public mutating func section(_ node: YAMLNode, path: String, known: [String], expected: String,
                                 nullIsEmpty: Bool = false,
                                 unknown: (_ name: String) -> (key: String, message: String)) -> YAMLSection? {
        if nullIsEmpty, YAMLText.isNull(node) { return YAMLSection(node: node) }
        guard case .mapping(let pairs) = node.kind else {
            report(node, path, "expected \(expected), got \(describe(node))")
            return nil
        }
        var s = YAMLSection(node: node)
        for pair in pairs {
            guard let scalar = pair.key.scalar else {
                report(pair.key, path, "expected a key name, got \(describe(pair.key))")
                continue
            }
            let name = scalar.string
            let full = path.isEmpty ? name : path + "." + name
            guard known.contains(name) else {
                let (key, message) = unknown(name)
                report(pair.key, key, message)
                continue
            }
            if let first = s.entries[name] {
                report(pair.key, full, "given twice (first on line \(first.keyLine))")
                continue
            }
            s.entries[name] = YAMLEntry(key: full, keyNode: pair.key, value: pair.value)
        }
        return s
    }

    /// The items of a list.
    public mutating func list(_ e: YAMLEntry, expected: String) -> [YAMLNode]? {
        guard case .sequence(let items) = e.value.kind else {
            report(e.value, e.key, "expected \(expected), got \(describe(e.value))")
            return nil
        }
        return items
    }

    /// The scalar's text as written (so `room: 101` is the room "101", and `no` stays "no").
    public mutating func text(_ e: YAMLEntry, expected: String) -> String? {
        guard let s = e.value.scalar else {
            report(e.value, e.key, "expected \(expected), got \(describe(e.value))")
            return nil
        }
        return s.string
    }

    /// `YAMLText.bool`'s spellings.
    public mutating func bool(_ e: YAMLEntry) -> Bool? {
        guard let t = text(e, expected: "true or false") else { return nil }
        guard let b = YAMLText.bool(t) else {
            report(e.value, e.key, "expected true or false, got \(quote(t))")
            return nil
        }
        return b
    }
}
