// The check every YAML file Baton reads passes before Yams composes it into nodes
// (docs/config.md "Errors", docs/simulator.md "Scenarios").
//
// Yams composes recursively, a few stack frames per level, so a file of five thousand `[`
// overflowed the stack and the gateway died of SIGSEGV (issue 16). libyaml's event parser keeps
// what is open on heap stacks and does not recurse, so walking its events first bounds the
// nesting Yams will see, whatever the text. The same walk refuses YAML tags: `!!int 5s` was read
// as 5 s, the tag ignored, and no value in Baton's files needs one — each key says how its
// value is read.
internal import CYAML
public import Yams

public enum YAMLShape {
    /// The deepest nesting of lists and sections (YAML sequences and mappings) a file may have.
    /// The deepest place Baton reads is 7 levels down (a scenario's
    /// `devices[0].script[1].walk.between`, counting the top mapping), so 64 refuses no file a
    /// person writes. Yams' recursion is fine that deep even on a secondary thread's smaller
    /// stack: the tests compose 64 levels on Swift Testing's worker threads. Where between 64
    /// and the 5000 it would overflow was not measured, and need not be.
    public static let maxDepth = 64

    /// `text` composed into nodes, after the check. Nesting deeper than `maxDepth` and YAML
    /// syntax throw, with the problems found before them. Tags do not stop the read: they are
    /// returned, for the reader to report in file order with the problems its schema finds.
    public static func compose(_ text: String, file: String) throws(YAMLFileError)
        -> (root: Node?, problems: [YAMLFileError]) {
        var bytes = text
        // `withUTF8` rethrows untyped errors, so the walk returns what it found instead.
        let walk = bytes.withUTF8 { check($0, file: file) }
        if walk.tooDeep {
            try YAMLFileError.throwFirst(walk.problems)
        }
        let failure: YAMLFileError
        do {
            return (try Yams.compose(yaml: text), walk.problems)
        } catch let error as YamlError {
            failure = YAMLFileError.syntax(error, file: file, text: text)
        } catch {
            failure = YAMLFileError(file: file, line: nil, key: "", message: "not readable as YAML: \(error)")
        }
        try YAMLFileError.throwFirst(walk.problems + [failure])
        preconditionFailure("throwFirst throws for a list that is not empty")
    }

    /// A collection open around the event being read.
    struct Open {
        /// Its anchor (`&name`), remembered with its height when it ends.
        var anchor: String?
        /// The height of its tallest child so far (0: none, or only scalars).
        var height = 0
    }

    /// Walks the events of `bytes`: the tags written, and whether nesting passed `maxDepth` (the
    /// walk stops there and that problem is the last). A syntax error ends the walk quietly:
    /// Yams reports it next, with the hint for tabs.
    static func check(_ bytes: UnsafeBufferPointer<UInt8>, file: String) -> (problems: [YAMLFileError], tooDeep: Bool) {
        // libyaml asserts its input is not NULL; an empty file has no events to check.
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return ([], false) }
        // The parser keeps a pointer to itself (`read_handler_data`, api.c), so it must not
        // move: it lives on the heap, not in a Swift variable the compiler may copy.
        let parser = UnsafeMutablePointer<yaml_parser_t>.allocate(capacity: 1)
        defer { parser.deallocate() }
        precondition(yaml_parser_initialize(parser) == 1, "libyaml could not allocate its parser")
        defer { yaml_parser_delete(parser) }
        // libyaml reads `bytes` only during the parse calls below, all inside `withUTF8`.
        yaml_parser_set_input_string(parser, base, bytes.count)

        var problems: [YAMLFileError] = []
        var open: [Open] = []
        // An alias (`*name`) puts its anchor's whole node where it stands, so the nesting Yams
        // builds is where the alias is plus the anchored node's height.
        var heights: [String: Int] = [:]
        var event = yaml_event_t()
        func tooDeep(_ line: Int, through alias: String? = nil) -> (problems: [YAMLFileError], tooDeep: Bool) {
            let through = alias.map { " through the alias *\($0)" } ?? ""
            problems.append(YAMLFileError(file: file, line: line, key: "",
                                          message: "YAML nesting deeper than \(maxDepth) levels\(through) (lists and "
                                              + "sections inside each other): is it the right file?"))
            return (problems, true)
        }
        func refuseTag(_ tag: UnsafeMutablePointer<yaml_char_t>?, _ line: Int) {
            guard let tag else { return }
            var written = String(cString: tag)
            // libyaml expands `!!int` to its full name (YAML 1.2 §6.8.2.2); show it as written.
            let standard = "tag:yaml.org,2002:"
            if written.hasPrefix(standard) { written = "!!" + written.dropFirst(standard.count) }
            problems.append(YAMLFileError(file: file, line: line, key: "",
                                          message: "YAML tag \(written) is not allowed: remove it, each key "
                                              + "already says how its value is read"))
        }
        func ended(height: Int) {
            if !open.isEmpty { open[open.count - 1].height = max(open[open.count - 1].height, height) }
        }
        func name(_ anchor: UnsafeMutablePointer<yaml_char_t>?) -> String? { anchor.map { String(cString: $0) } }

        while yaml_parser_parse(parser, &event) == 1 {
            defer { yaml_event_delete(&event) }
            // libyaml counts lines from 0.
            let line = Int(event.start_mark.line) + 1
            switch event.type {
            case YAML_STREAM_END_EVENT:
                return (problems, false)
            case YAML_SCALAR_EVENT:
                refuseTag(event.data.scalar.tag, line)
            case YAML_SEQUENCE_START_EVENT, YAML_MAPPING_START_EVENT:
                let isSequence = event.type == YAML_SEQUENCE_START_EVENT
                refuseTag(isSequence ? event.data.sequence_start.tag : event.data.mapping_start.tag, line)
                guard open.count < maxDepth else { return tooDeep(line) }
                open.append(Open(anchor: name(isSequence ? event.data.sequence_start.anchor
                                                         : event.data.mapping_start.anchor)))
            case YAML_SEQUENCE_END_EVENT, YAML_MAPPING_END_EVENT:
                guard let closed = open.popLast() else { preconditionFailure("libyaml ended a collection it never started") }
                if let anchor = closed.anchor { heights[anchor] = closed.height + 1 }
                ended(height: closed.height + 1)
            case YAML_ALIAS_EVENT:
                // An unknown alias has height 0 here; Yams refuses it next.
                let alias = name(event.data.alias.anchor) ?? ""
                let height = heights[alias] ?? 0
                guard open.count + height <= maxDepth else { return tooDeep(line, through: alias) }
                ended(height: height)
            default:
                break
            }
        }
        return (problems, false)
    }
}
