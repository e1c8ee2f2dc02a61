// What the two YAML files Baton reads have in common — the gateway's config (docs/config.md)
// and the simulator's scenarios (docs/simulator.md "Scenarios"): one error shape a user fixes
// from, `FILE:LINE: KEY: MESSAGE`, the whole file checked before anything is refused, YAML's
// own syntax errors said the same way, and the suggestion for a mistyped key (YAMLReader.swift
// holds the schema checks both make). Each reader keeps its own schema and value rules.
//
// Embedded Swift: no Foundation, typed throws, no reflection (every text is built from strings
// and integers).

/// A problem with a YAML file, said the way a user fixes it: file, line, key, what was expected.
public struct YAMLFileError: Error, Sendable, Equatable, CustomStringConvertible {
    public var file: String
    public var line: Int?
    /// The dotted key or key path (`broker.keepalive`, `devices[0].script[1].walk`), a flag
    /// (`--broker`), or empty for the file as a whole.
    public var key: String
    public var message: String
    /// The file's other problems, in file order: one run shows every mistake.
    public var others: [YAMLFileError] = []

    public init(file: String, line: Int?, key: String, message: String, others: [YAMLFileError] = []) {
        self.file = file; self.line = line; self.key = key; self.message = message; self.others = others
    }

    /// This problem and the others, in file order.
    public var all: [YAMLFileError] {
        var first = self
        first.others = []
        return [first] + others
    }

    /// `FILE:LINE: KEY: MESSAGE`, one line per problem.
    public var description: String {
        var text = ""
        for (i, e) in all.enumerated() {
            if i > 0 { text += "\n" }
            text += e.file
            if let line = e.line { text += ":\(line)" }
            if !e.key.isEmpty { text += ": \(e.key)" }
            text += ": \(e.message)"
        }
        return text
    }

    /// Throws the first of `errors` in file order, with the rest as its `others`; problems a
    /// later cross-check found slot in by line. Returns when there are none.
    public static func throwFirst(_ errors: [YAMLFileError]) throws(YAMLFileError) {
        let sorted = errors.enumerated()
            .sorted { ($0.element.line ?? .max, $0.offset) < ($1.element.line ?? .max, $1.offset) }
            .map { $0.element }
        if var first = sorted.first {
            first.others = Array(sorted.dropFirst())
            throw first
        }
    }
}

public enum YAMLText {
    /// YAML's null (`~`, `null`, or nothing after the colon); a quoted "null" is text.
    public static func isNull(_ node: YAMLNode) -> Bool {
        guard let s = node.scalar, s.isPlain else { return false }
        return ["", "~", "null", "Null", "NULL"].contains(s.string)
    }

    /// `true`/`false` and the YAML 1.1 spellings Home Assistant users also write (`yes`/`no`,
    /// `on`/`off`), in any letter case: what Yams' `Bool.construct` accepted, whatever the
    /// quoting. ASCII case folding is enough: no other letter lowercases to one of these.
    public static func bool(_ text: String) -> Bool? {
        var folded: [UInt8] = []
        for u in text.utf8 {
            // The longest spelling is 5 letters.
            guard folded.count < 5 else { return nil }
            folded.append(u >= 0x41 && u <= 0x5A ? u + 0x20 : u)
        }
        let lower = String(decoding: folded, as: UTF8.self)
        switch lower {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default: return nil
        }
    }

    /// Decimal (`256`, `-1`), or hexadecimal after `0x`. Not YAML 1.1's octal: `010` is ten. Not
    /// `+5` either, which Swift's `Int("+5")` reads as 5: no value Baton reads is written with a
    /// plus, so one is more likely a slip (`+` for `-`, a pasted diff line) than a sign (issue 16).
    /// nil past `Int`'s range.
    public static func integer(_ text: String) -> Int? {
        if text.hasPrefix("+") { return nil }
        if text.hasPrefix("0x") || text.hasPrefix("0X") {
            // Hex digits only: `Int(_:radix:)` would also take a sign after the 0x.
            let digits = text.dropFirst(2)
            guard !digits.isEmpty, digits.utf8.allSatisfy(isHexDigit) else { return nil }
            return Int(digits, radix: 16)
        }
        return Int(text)
    }

    static func isHexDigit(_ u: UInt8) -> Bool {
        (u >= 0x30 && u <= 0x39) || (u >= 0x41 && u <= 0x46) || (u >= 0x61 && u <= 0x66)
    }

    /// `a, b or c`.
    public static func listed(_ items: [String]) -> String {
        guard let last = items.last, items.count > 1 else { return items.first ?? "" }
        return items.dropLast().joined(separator: ", ") + " or " + last
    }

    /// The known name within a small edit distance of `name` (a typo, `_` for `-`, another
    /// case), if any: one edit for names up to `shortName` characters, two beyond.
    public static func closest(to name: String, among candidates: [String], shortName: Int) -> String? {
        let typed = Array(name.lowercased())
        let allowed = typed.count <= shortName ? 1 : 2
        var best: (key: String, distance: Int)? = nil
        for candidate in candidates {
            let d = editDistance(typed, Array(candidate))
            if d <= allowed, d < (best?.distance ?? .max) { best = (candidate, d) }
        }
        return best?.key
    }

    /// Levenshtein distance (insert, delete, substitute; each costs 1).
    static func editDistance(_ a: [Character], _ b: [Character]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)
                current[j] = min(substitution, previous[j] + 1, current[j - 1] + 1)
            }
            swap(&previous, &current)
        }
        return previous[b.count]
    }
}
