// Every YAML file Baton reads becomes nodes here (docs/config.md "Errors", docs/simulator.md
// "Scenarios"), on Debian's libyaml and nothing else, so the readers build as Embedded Swift.
//
// One walk over libyaml's events (yaml_parser_parse) composes the nodes. The walk keeps what is
// open on its own heap stack and never recurses: Yams composed recursively, and a file of five
// thousand `[` overflowed the stack (issue 16). Nesting is still capped at `maxDepth`, so a
// reader's own walks over the tree stay shallow whatever the text. The same walk refuses YAML
// tags: `!!int 5s` was read as 5 s, the tag ignored, and no value in Baton's files needs one —
// each key says how its value is read.
//
// What Yams did, kept: one document (a second is an error, an empty stream is no root),
// aliases put their anchor's node where they stand (an anchor is defined once its node ends,
// so `&a [*a]` is an undefined alias), and errors read `LINE: YAML syntax: PROBLEM (CONTEXT on
// line N)`. After the first error that ends composing (an undefined alias, a second document)
// the walk goes on for tags and depth only, as YAMLShape's walk did before Yams composed.
internal import CYAML

public enum YAMLComposer {
    /// The deepest nesting of lists and sections (YAML sequences and mappings) a file may have,
    /// aliases counted as the nesting they stand for. The deepest place Baton reads is 7 levels
    /// down (a scenario's `devices[0].script[1].walk.between`, counting the top mapping), so 64
    /// refuses no file a person writes.
    public static let maxDepth = 64

    /// `text` composed into nodes. Nesting deeper than `maxDepth`, YAML syntax and composing
    /// errors throw, with the tags found before them. Tags alone do not stop the read: they are
    /// returned, for the reader to report in file order with the problems its schema finds.
    public static func compose(_ text: String, file: String) throws(YAMLFileError)
        -> (root: YAMLNode?, problems: [YAMLFileError]) {
        var text = text
        // `withUTF8` rethrows untyped errors, so the walk returns what it found instead.
        let walk = text.withUTF8 { walkEvents($0, file: file) }
        return try walk.result()
    }

    /// `bytes` composed as `compose(_:file:)` does. libyaml refuses bytes that are not UTF-8.
    public static func compose(utf8 bytes: UnsafeBufferPointer<UInt8>, file: String) throws(YAMLFileError)
        -> (root: YAMLNode?, problems: [YAMLFileError]) {
        try walkEvents(bytes, file: file).result()
    }

    struct Walk {
        var root: YAMLNode?
        /// The tags refused, then the depth error if there was one.
        var problems: [YAMLFileError] = []
        /// The first error that ended composing; the walk then checked only tags and depth.
        var failure: YAMLFileError?
        var tooDeep = false

        func result() throws(YAMLFileError) -> (root: YAMLNode?, problems: [YAMLFileError]) {
            // Too deep ends the read where it passes the cap; what Yams would have said after it
            // was never reached.
            if tooDeep { try YAMLFileError.throwFirst(problems) }
            if let failure { try YAMLFileError.throwFirst(problems + [failure]) }
            return (root, problems)
        }
    }

    /// A sequence or mapping open around the event being read.
    struct Open {
        var line: Int
        var column: Int
        var isMapping: Bool
        var anchor: String?
        var items: [YAMLNode] = []
        var pairs: [YAMLPair] = []
        /// A mapping's key, until its value ends.
        var key: YAMLNode?
        /// The height of its tallest child so far (0: none, or only scalars).
        var height = 0
    }

    static func walkEvents(_ bytes: UnsafeBufferPointer<UInt8>, file: String) -> Walk {
        var walk = Walk()
        // libyaml asserts its input is not NULL; an empty file is a stream of no documents.
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return walk }
        // The parser keeps a pointer to itself (`read_handler_data`, api.c), so it must not
        // move: it lives on the heap, not in a Swift variable the compiler may copy.
        let parser = UnsafeMutablePointer<yaml_parser_t>.allocate(capacity: 1)
        defer { parser.deallocate() }
        precondition(yaml_parser_initialize(parser) == 1, "libyaml could not allocate its parser")
        defer { yaml_parser_delete(parser) }
        // libyaml reads `bytes` only during the parse calls below, all inside this function.
        yaml_parser_set_input_string(parser, base, bytes.count)
        yaml_parser_set_encoding(parser, YAML_UTF8_ENCODING)

        var open: [Open] = []
        // An alias puts its anchor's whole node where it stands, so the nesting it makes is
        // where the alias is plus the anchored node's height.
        var anchors: [String: (node: YAMLNode, height: Int)] = [:]
        var documents = 0

        func problem(_ line: Int, _ message: String) -> YAMLFileError {
            YAMLFileError(file: file, line: line, key: "", message: message)
        }
        func fail(_ error: YAMLFileError) {
            if walk.failure == nil { walk.failure = error }
        }
        func refuseTag(_ tag: UnsafeMutablePointer<yaml_char_t>?, _ line: Int) {
            guard let tag else { return }
            var written = String(cString: tag)
            // libyaml expands `!!int` to its full name (YAML 1.2 §6.8.2.2); show it as written.
            let standard = "tag:yaml.org,2002:"
            if written.hasPrefix(standard) { written = "!!" + written.dropFirst(standard.count) }
            walk.problems.append(problem(line, "YAML tag \(written) is not allowed: remove it, each key "
                                             + "already says how its value is read"))
        }
        func tooDeep(_ line: Int, through alias: String? = nil) -> Walk {
            var through = ""
            if let alias { through = " through the alias *" + alias }
            walk.problems.append(problem(line, "YAML nesting deeper than \(maxDepth) levels\(through) (lists and "
                                             + "sections inside each other): is it the right file?"))
            walk.tooDeep = true
            return walk
        }
        /// `node`, `height` levels tall, goes where the walk stands.
        func ended(_ node: YAMLNode, height: Int) {
            guard !open.isEmpty else {
                // A document's root; a second document is already the failure.
                if documents == 1 { walk.root = node }
                return
            }
            let i = open.count - 1
            open[i].height = max(open[i].height, height)
            if !open[i].isMapping {
                open[i].items.append(node)
            } else if let key = open[i].key {
                open[i].pairs.append(YAMLPair(key: key, value: node))
                open[i].key = nil
            } else {
                open[i].key = node
            }
        }
        func string(_ text: UnsafeMutablePointer<yaml_char_t>?) -> String? { text.map { String(cString: $0) } }

        var event = yaml_event_t()
        while yaml_parser_parse(parser, &event) == 1 {
            defer { yaml_event_delete(&event) }
            // libyaml counts lines and columns from 0.
            let line = Int(event.start_mark.line) + 1, column = Int(event.start_mark.column) + 1
            switch event.type {
            case YAML_STREAM_END_EVENT:
                return walk
            case YAML_DOCUMENT_START_EVENT:
                documents += 1
                if documents == 2 {
                    fail(problem(line, "YAML syntax: but found another document "
                                     + "(expected a single document in the stream on line 1)"))
                }
            case YAML_SCALAR_EVENT:
                let s = event.data.scalar
                refuseTag(s.tag, line)
                // Proof: libyaml's scalar is `length` bytes at `value` (NUL-terminated after).
                let value = String(decoding: UnsafeBufferPointer(start: s.value, count: s.length), as: UTF8.self)
                let style: YAMLScalar.Style = switch s.style {
                case YAML_SINGLE_QUOTED_SCALAR_STYLE: .singleQuoted
                case YAML_DOUBLE_QUOTED_SCALAR_STYLE: .doubleQuoted
                case YAML_LITERAL_SCALAR_STYLE: .literal
                case YAML_FOLDED_SCALAR_STYLE: .folded
                default: .plain
                }
                let node = YAMLNode(.scalar(YAMLScalar(value, style: style)), line: line, column: column)
                if let anchor = string(s.anchor) { anchors[anchor] = (node, 0) }
                ended(node, height: 0)
            case YAML_SEQUENCE_START_EVENT, YAML_MAPPING_START_EVENT:
                let isMapping = event.type == YAML_MAPPING_START_EVENT
                refuseTag(isMapping ? event.data.mapping_start.tag : event.data.sequence_start.tag, line)
                guard open.count < maxDepth else { return tooDeep(line) }
                open.append(Open(line: line, column: column, isMapping: isMapping,
                                 anchor: string(isMapping ? event.data.mapping_start.anchor
                                                          : event.data.sequence_start.anchor)))
            case YAML_SEQUENCE_END_EVENT, YAML_MAPPING_END_EVENT:
                guard let closed = open.popLast() else { preconditionFailure("libyaml ended a collection it never started") }
                let node = YAMLNode(closed.isMapping ? .mapping(closed.pairs) : .sequence(closed.items),
                                    line: closed.line, column: closed.column)
                if let anchor = closed.anchor { anchors[anchor] = (node, closed.height + 1) }
                ended(node, height: closed.height + 1)
            case YAML_ALIAS_EVENT:
                let name = string(event.data.alias.anchor) ?? ""
                guard let anchored = anchors[name] else {
                    fail(problem(line, "YAML syntax: found undefined alias"))
                    // Keeps keys and values paired while the walk goes on for tags and depth.
                    ended(YAMLNode(.scalar(YAMLScalar("")), line: line, column: column), height: 0)
                    continue
                }
                guard open.count + anchored.height <= maxDepth else { return tooDeep(line, through: name) }
                ended(anchored.node, height: anchored.height)
            default:
                break
            }
        }
        // A syntax error. After a composing error Yams stopped before reaching it.
        fail(syntaxError(parser.pointee, bytes, file: file))
        return walk
    }

    /// libyaml's error as a user reads it, with a hint for the commonest one (a tab).
    static func syntaxError(_ parser: yaml_parser_t, _ bytes: UnsafeBufferPointer<UInt8>, file: String) -> YAMLFileError {
        let problem = parser.problem.map { String(cString: $0) } ?? "unknown problem"
        switch parser.error {
        case YAML_SCANNER_ERROR, YAML_PARSER_ERROR:
            let line = Int(parser.problem_mark.line) + 1
            var message = "YAML syntax: " + problem
            if let context = parser.context {
                message += " (" + String(cString: context) + " on line \(Int(parser.context_mark.line) + 1))"
            }
            if indentHasTab(bytes, line: line) { message += "; indent with spaces, YAML does not allow tabs" }
            return YAMLFileError(file: file, line: line, key: "", message: message)
        case YAML_READER_ERROR:
            // A reader error has an offset, not a mark: the bytes before it say the line.
            let offset = min(Int(parser.problem_offset), bytes.count)
            var line = 1
            for b in bytes[..<offset] where b == 0x0A { line += 1 }
            var message = "not readable as YAML: " + problem
            if parser.problem_value >= 0 {
                message += " (U+" + hex4(Int(parser.problem_value)) + ")"
            }
            return YAMLFileError(file: file, line: line, key: "", message: message)
        default:
            // YAML_MEMORY_ERROR, the only other error a parser sets: an allocation failed.
            return YAMLFileError(file: file, line: nil, key: "", message: "not readable as YAML: out of memory")
        }
    }

    /// Whether line `line` (from 1) starts with blanks that include a tab.
    static func indentHasTab(_ bytes: UnsafeBufferPointer<UInt8>, line: Int) -> Bool {
        var current = 1
        for b in bytes {
            if b == 0x0A {
                current += 1
                if current > line { return false }
                continue
            }
            guard current == line else { continue }
            if b == 0x09 { return true }
            if b != 0x20 { return false }
        }
        return false
    }

    static func hex4(_ n: Int) -> String {
        let digits = String(n, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }
}
