// The composer under both YAML readers (docs/config.md "Format" and "Errors"): YAML text in,
// nodes with their lines out, or the error a user reads. Expected texts are byte for byte.
import Testing
import BatonYAML

private func compose(_ text: String) throws(YAMLFileError) -> (root: YAMLNode?, problems: [YAMLFileError]) {
    try YAMLComposer.compose(text, file: "f.yaml")
}

/// The error `text` throws, as printed; nil if it composes.
private func error(_ text: String) -> String? {
    do throws(YAMLFileError) {
        _ = try compose(text)
        return nil
    } catch {
        return error.description
    }
}

private func plain(_ s: String, _ line: Int, _ column: Int) -> YAMLNode {
    YAMLNode(.scalar(YAMLScalar(s)), line: line, column: column)
}

private func pair(_ key: YAMLNode, _ value: YAMLNode) -> YAMLPair { YAMLPair(key: key, value: value) }

@Suite struct YAMLComposerNodeTests {
    @Test func aBlockMappingKeepsOrderLinesAndColumns() throws {
        let text = "# a comment\nbroker:\n  url: mqtt://pi.lan\n  keepalive: 30s\ntable: {capacity: 5}\nlist:\n  - a\n  - 'b'\n"
        let root = try #require(try compose(text).root)
        let expected = YAMLNode(.mapping([
            pair(plain("broker", 2, 1), YAMLNode(.mapping([
                pair(plain("url", 3, 3), plain("mqtt://pi.lan", 3, 8)),
                pair(plain("keepalive", 4, 3), plain("30s", 4, 14)),
            ]), line: 3, column: 3)),
            pair(plain("table", 5, 1), YAMLNode(.mapping([
                pair(plain("capacity", 5, 9), plain("5", 5, 19)),
            ]), line: 5, column: 8)),
            pair(plain("list", 6, 1), YAMLNode(.sequence([
                plain("a", 7, 5),
                YAMLNode(.scalar(YAMLScalar("b", style: .singleQuoted)), line: 8, column: 5),
            ]), line: 7, column: 3)),
        ]), line: 2, column: 1)
        #expect(root == expected)
    }

    /// The readers tell `yes` from `"yes"` and `~` from `"~"` by style alone: YAML gives a plain
    /// scalar no type of its own here.
    @Test func scalarsKeepTheirStyleAndText() throws {
        let text = "- yes\n- \"yes\"\n- 'it''s'\n- \"tab\\there\\0\"\n- |\n  line\n- >\n  folded\n  text\n- ~\n- \n"
        let root = try #require(try compose(text).root)
        guard case .sequence(let items) = root.kind else { Issue.record("not a list: \(root)"); return }
        #expect(items.map { $0.scalar?.style } == [.plain, .doubleQuoted, .singleQuoted, .doubleQuoted, .literal,
                                                     .folded, .plain, .plain])
        #expect(items.map { $0.scalar?.string } == ["yes", "yes", "it's", "tab\there\0", "line\n", "folded text\n", "~", ""])
        #expect(items.map(\.line) == [1, 2, 3, 4, 5, 7, 10, 11])
        #expect(items.map { YAMLText.isNull($0) } == [false, false, false, false, false, false, true, true])
    }

    @Test func aKeyGivenTwiceIsKeptTwiceForTheReader() throws {
        let root = try #require(try compose("a: 1\na: 2\n").root)
        #expect(root.kind == .mapping([pair(plain("a", 1, 1), plain("1", 1, 4)), pair(plain("a", 2, 1), plain("2", 2, 4))]))
    }

    @Test func aKeyMayBeACollection() throws {
        let root = try #require(try compose("[a, b]: c\n").root)
        guard case .mapping(let pairs) = root.kind else { Issue.record("not a mapping"); return }
        #expect(pairs.count == 1 && pairs[0].key.kind == .sequence([plain("a", 1, 2), plain("b", 1, 5)]))
    }

    /// As Yams: no document is no root; `---` alone is a document holding an empty plain scalar.
    @Test(arguments: [("", nil), ("# nothing\n", nil), ("\n\n", nil), ("---\n", ""), ("--- ~\n", "~")] as [(String, String?)])
    func anEmptyStream(text: String, root: String?) throws {
        let composed = try compose(text)
        #expect(composed.root?.scalar?.string == root)
        #expect(composed.root?.scalar?.isPlain ?? true)
        #expect(composed.problems.isEmpty)
    }

    @Test func aSecondDocumentIsRefusedAtItsStart() {
        #expect(error("a: 1\n---\nb: 2\n")
                == "f.yaml:2: YAML syntax: but found another document (expected a single document in the stream on line 1)")
        // Ending the first explicitly changes nothing.
        #expect(error("a: 1\n...\n--- b\n")?.hasPrefix("f.yaml:3: YAML syntax: but found another document") == true)
    }
}

@Suite struct YAMLComposerErrorTests {
    @Test func aSyntaxErrorNamesItsLineAndContext() {
        #expect(error("broker:\n  url: mqtt://pi.lan\n keepalive: 30s\n")
                == "f.yaml:3: YAML syntax: did not find expected key (while parsing a block mapping on line 1)")
        #expect(error("gateway:\n  room: \"Kitchen\n")
                == "f.yaml:3: YAML syntax: found unexpected end of stream (while scanning a quoted scalar on line 2)")
        #expect(error("a: [1, 2\n")
                == "f.yaml:2: YAML syntax: did not find expected ',' or ']' (while parsing a flow sequence on line 1)")
    }

    @Test func aTabInTheIndentIsNamed() {
        #expect(error("broker:\n\turl: mqtt://pi.lan\n")
                == "f.yaml:2: YAML syntax: found character that cannot start any token (while scanning for the next token on line 2); indent with spaces, YAML does not allow tabs")
        // Also after spaces, and in a file with CRLF line ends.
        #expect(error("broker:\r\n  \turl: x\r\n")?.hasSuffix("; indent with spaces, YAML does not allow tabs") == true)
        // Not for a tab inside a value.
        #expect(error("a: \"x\n  \tb: [\n")?.contains("tabs") == false)
    }

    /// libyaml refuses control characters before it scans; the bytes before one say its line.
    @Test func aControlCharacterIsRefusedWithItsLine() {
        #expect(error("a: 1\nb: \"x\u{01}\"\n") == "f.yaml:2: not readable as YAML: control characters are not allowed (U+0001)")
    }

    @Test func bytesThatAreNotUTF8AreRefused() {
        let bytes: [UInt8] = Array("a: 1\nb: K".utf8) + [0xFC] + Array("che\n".utf8)
        let description: String? = bytes.withUnsafeBufferPointer { buffer in
            do throws(YAMLFileError) {
                _ = try YAMLComposer.compose(utf8: buffer, file: "f.yaml")
                return nil
            } catch {
                return error.description
            }
        }
        #expect(description?.hasPrefix("f.yaml:2: not readable as YAML: invalid") == true, "\(description ?? "composed")")
    }
}

// MARK: - Nesting, tags, aliases (issue 16)

private func flowLists(_ depth: Int) -> String {
    String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
}

private let tooDeep = "YAML nesting deeper than 64 levels (lists and sections inside each other): is it the right file?"

@Suite struct YAMLComposerDepthTests {
    @Test func sixtyFourLevelsComposeAndSixtyFiveDoNot() throws {
        var node = try #require(try compose(flowLists(64)).root)
        var depth = 1
        while case .sequence(let items) = node.kind, let inner = items.first { node = inner; depth += 1 }
        #expect(depth == 64 && node.kind == .sequence([]))
        #expect(error(flowLists(65)) == "f.yaml:1: \(tooDeep)")
    }

    /// The issue's file: refused where it passes the cap, without recursing through the rest.
    @Test func fiveThousandLevelsAreRefusedAtTheFirstPastTheCap() {
        #expect(error(String(repeating: "[", count: 5000) + "\n") == "f.yaml:1: \(tooDeep)")
        let blocks = (0..<3000).map { String(repeating: " ", count: $0) + "- \n" }.joined()
        #expect(error(blocks) == "f.yaml:65: \(tooDeep)")
    }

    /// An alias stands for its anchor's whole node: 1 + 23 + 40 = 64 composes, one more does not.
    @Test func anAliasCountsAsTheNestingItStandsFor() throws {
        func text(inside lists: Int) -> String {
            "x: &deep " + flowLists(40) + "\ny: " + String(repeating: "[", count: lists) + "*deep"
                + String(repeating: "]", count: lists) + "\n"
        }
        _ = try compose(text(inside: 23))
        #expect(error(text(inside: 24)) == "f.yaml:2: YAML nesting deeper than 64 levels through the alias *deep "
                + "(lists and sections inside each other): is it the right file?")
    }

    /// Tags are returned, not thrown; the nodes they are on compose as if untagged.
    @Test func aTagIsRefusedWithItsLineAndTheNodeStillComposes() throws {
        let (root, problems) = try compose("status:\n  interval: !!int 5s\ngateway: !section\n  room: Kitchen\n")
        #expect(problems.map(\.description) == [
            "f.yaml:2: YAML tag !!int is not allowed: remove it, each key already says how its value is read",
            "f.yaml:3: YAML tag !section is not allowed: remove it, each key already says how its value is read",
        ])
        guard case .mapping(let pairs) = root?.kind else { Issue.record("not a mapping"); return }
        // A node starts at its tag, as libyaml marks it.
        #expect(pairs.first?.value.kind == .mapping([pair(plain("interval", 2, 3), plain("5s", 2, 13))]))
    }

    /// A syntax or depth error is thrown with the tags found before it, in file order.
    @Test func tagsBeforeAFatalErrorAreReportedWithIt() {
        #expect(error("a: !x 1\nb: [\n") == """
            f.yaml:1: YAML tag !x is not allowed: remove it, each key already says how its value is read
            f.yaml:3: YAML syntax: did not find expected node content (while parsing a flow node on line 3)
            """)
        #expect(error("a: !x 1\nb: " + flowLists(65) + "\n") == """
            f.yaml:1: YAML tag !x is not allowed: remove it, each key already says how its value is read
            f.yaml:2: \(tooDeep)
            """)
    }
}

@Suite struct YAMLComposerAliasTests {
    /// As Yams: an alias is its anchor's node, with the anchor's line.
    @Test func anAliasIsTheAnchoredNode() throws {
        let root = try #require(try compose("x: &a {k: v}\ny: *a\nz: &s text\nw: *s\n").root)
        guard case .mapping(let pairs) = root.kind else { Issue.record("not a mapping"); return }
        #expect(pairs[1].value == pairs[0].value)
        #expect(pairs[1].value.line == 1)
        #expect(pairs[3].value == plain("text", 3, 4))
    }

    /// An anchor is defined when its node ends, so a node cannot hold itself; a later anchor of
    /// the same name replaces the earlier.
    @Test func anUndefinedAliasIsAnError() throws {
        #expect(error("a: *nowhere\n") == "f.yaml:1: YAML syntax: found undefined alias")
        #expect(error("a: &a [*a]\n") == "f.yaml:1: YAML syntax: found undefined alias")
        let root = try #require(try compose("- &a one\n- &a two\n- *a\n").root)
        // A node starts at its anchor, as libyaml marks it.
        #expect(root.kind == .sequence([plain("one", 1, 3), plain("two", 2, 3), plain("two", 2, 3)]))
    }

    /// After the error that ends composing the walk still reports tags and depth, and nothing
    /// libyaml says after it: what the readers printed when Yams composed after a check.
    @Test func afterAnUndefinedAliasOnlyTagsAndDepthAreReported() {
        #expect(error("a: *nowhere\nb: !t 1\nc: [\n") == """
            f.yaml:1: YAML syntax: found undefined alias
            f.yaml:2: YAML tag !t is not allowed: remove it, each key already says how its value is read
            """)
        #expect(error("a: *nowhere\nb: " + flowLists(65) + "\n") == "f.yaml:2: \(tooDeep)")
        #expect(error("a: 1\n---\nb: !t 2\n") == """
            f.yaml:2: YAML syntax: but found another document (expected a single document in the stream on line 1)
            f.yaml:3: YAML tag !t is not allowed: remove it, each key already says how its value is read
            """)
    }

    /// Aliases share their anchor's storage, as Yams' value types did: a file of nested
    /// aliases composes in the size of its text, not of the tree it stands for.
    @Test func aliasesOfAliasesComposeQuickly() throws {
        var text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
        for i in 1...20 {
            text += "a\(i): &a\(i) [" + Array(repeating: "*a\(i - 1)", count: 10).joined(separator: ", ") + "]\n"
        }
        let root = try #require(try compose(text).root)
        guard case .mapping(let pairs) = root.kind else { Issue.record("not a mapping"); return }
        #expect(pairs.count == 21)
    }
}

// MARK: - Shared value rules and schema checks

@Suite struct YAMLTextTests {
    /// What Yams' `Bool.construct` accepted: YAML 1.1's spellings in any case, nothing else.
    @Test func booleans() {
        for t in ["true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "tRuE"] { #expect(YAMLText.bool(t) == true, "\(t)") }
        for t in ["false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"] { #expect(YAMLText.bool(t) == false, "\(t)") }
        for t in ["", "y", "n", "1", "0", "t", "f", "truee", "ye s", " true", "true ", "enabled", "nope", "o", "ja", "\u{212A}"] {
            #expect(YAMLText.bool(t) == nil, "\(t)")
        }
    }

    @Test func wholeNumbers() {
        #expect(YAMLText.integer("256") == 256)
        #expect(YAMLText.integer("-1") == -1)
        #expect(YAMLText.integer("010") == 10)
        #expect(YAMLText.integer("0xFFFF") == 0xFFFF && YAMLText.integer("0Xff") == 0xFF)
        #expect(YAMLText.integer("9223372036854775807") == .max)
        for t in ["", "+5", "+0xFF", "0x", "0x+FF", "0x-1", "0xG", "1e3", "5s", "1_000", "9223372036854775808", "0o17", "١"] {
            #expect(YAMLText.integer(t) == nil, "\(t)")
        }
    }
}

@Suite struct YAMLReaderTests {
    private func section(_ text: String, nullIsEmpty: Bool = false) throws -> (YAMLSection?, [String]) {
        let root = try #require(try compose(text).root)
        var reader = YAMLReader(file: "f.yaml", mappingName: "a section of keys", quote: { "\"" + $0 + "\"" })
        let s = reader.section(root, path: "top", known: ["a", "b"], expected: "a section", nullIsEmpty: nullIsEmpty) {
            ("top." + $0, "unknown key")
        }
        return (s, reader.errors.map(\.description))
    }

    @Test func knownKeysAreReadAndTheRestReported() throws {
        let (s, errors) = try section("a: 1\nc: 2\na: 3\n[x]: 4\nb: ~\n")
        #expect(s?["a"]?.value == plain("1", 1, 4) && s?["a"]?.key == "top.a" && s?["a"]?.keyLine == 1)
        #expect(s?["b"] == nil && s?.entries["b"] != nil, "a null value reads as absent, but was written")
        #expect(errors == [
            "f.yaml:2: top.c: unknown key",
            "f.yaml:3: top.a: given twice (first on line 1)",
            #"f.yaml:4: top: expected a key name, got a list"#,
        ])
    }

    @Test func aValueOfTheWrongShape() throws {
        #expect(try section("- a\n").1 == ["f.yaml:1: top: expected a section, got a list"])
        #expect(try section("word\n").1 == [#"f.yaml:1: top: expected a section, got "word""#])
        #expect(try section("~\n").1 == [#"f.yaml:1: top: expected a section, got "~""#])
        #expect(try section("~\n", nullIsEmpty: true).1.isEmpty)
        let root = try #require(try compose("a: {b: 1}\nc: maybe\nd: Off\n").root)
        guard case .mapping(let pairs) = root.kind else { Issue.record("not a mapping"); return }
        var reader = YAMLReader(file: "f.yaml", mappingName: "a mapping of keys", quote: { "<" + $0 + ">" })
        let entries = pairs.map { YAMLEntry(key: $0.key.scalar?.string ?? "", keyNode: $0.key, value: $0.value) }
        #expect(reader.text(entries[0], expected: "text") == nil)
        #expect(reader.bool(entries[1]) == nil)
        #expect(reader.bool(entries[2]) == false)
        #expect(reader.list(entries[2], expected: "a list") == nil)
        #expect(reader.errors.map(\.description) == [
            "f.yaml:1: a: expected text, got a mapping of keys",
            "f.yaml:2: c: expected true or false, got <maybe>",
            "f.yaml:3: d: expected a list, got <Off>",
        ])
    }
}
