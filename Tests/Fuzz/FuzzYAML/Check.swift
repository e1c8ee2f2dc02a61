// Fuzz target: the YAML composer under the config and scenario readers (docs/config.md
// "Errors", docs/simulator.md "Scenarios"). The input is a whole file's bytes, UTF-8 or not.
// Invariants:
//   * it composes or throws a `YAMLFileError`, never traps, whatever the nesting (issue 16);
//   * a composed tree is at most `YAMLComposer.maxDepth` deep, aliases counted where they
//     stand, and every node's line and column lie inside the file;
//   * the problems returned with a tree are tag refusals only;
//   * a thrown error lists its problems in file order (lines ascending, none last), all of this
//     file, at most one of them not a tag (the syntax, depth or composing error), each a line
//     where the file has one;
//   * bytes that are UTF-8 compose the same from a `String` (the readers' path) as from bytes.
import BatonYAML
import FuzzSupport

/// Walks at most this many nodes: aliases can make a tree exponentially larger than its text.
let nodeBudget = 100_000

func check(_ raw: UnsafeRawBufferPointer) {
    let bytes = raw.bindMemory(to: UInt8.self)
    // libyaml breaks lines at LF, CR, CRLF, NEL (C2 85), LS and PS (E2 80 A8/A9): counting each
    // of those bytes bounds its line count from above. One more: a file that does not end with
    // a line break gets one at its end (scanner.c, yaml_parser_fetch_stream_end), and an error
    // at the end of the stream is marked on the line after it, as Yams reported it too.
    var lines = 2
    for b in bytes where b == 0x0A || b == 0x0D || b == 0x85 || b == 0xA8 || b == 0xA9 { lines += 1 }

    let outcome: Outcome
    do throws(YAMLFileError) {
        let (root, problems) = try YAMLComposer.compose(utf8: bytes, file: "f")
        for p in problems {
            invariant(p.message.hasPrefix("YAML tag ") && p.line.map { (1...lines).contains($0) } == true,
                      "a problem returned with the tree: \(p.description)")
        }
        if let root { checkTree(root, lines: lines) }
        outcome = .composed(hasRoot: root != nil, problems: problems.map { $0.description })
    } catch {
        let all = error.all
        var previous = 0
        var fatal = 0
        for e in all {
            invariant(e.file == "f" && e.key.isEmpty && e.others.isEmpty, "a stray error: \(e.description)")
            if !e.message.hasPrefix("YAML tag ") { fatal += 1 }
            invariant(e.message.hasPrefix("YAML tag ") || e.message.hasPrefix("YAML syntax: ")
                      || e.message.hasPrefix("YAML nesting deeper than 64 levels")
                      || e.message.hasPrefix("not readable as YAML: "), "an unknown error: \(e.description)")
            if let line = e.line {
                invariant((1...lines).contains(line), "line \(line) of a file of at most \(lines): \(e.description)")
                invariant(line >= previous, "not in file order: \(error.description)")
                previous = line
            } else {
                previous = .max
                invariant(e.message == "not readable as YAML: out of memory", "no line: \(e.description)")
            }
        }
        invariant(fatal <= 1, "\(fatal) errors that end the read: \(error.description)")
        outcome = .thrown(error.description)
    }

    if let text = String(validating: bytes, as: UTF8.self) {
        let again: Outcome
        do throws(YAMLFileError) {
            let (root, problems) = try YAMLComposer.compose(text, file: "f")
            again = .composed(hasRoot: root != nil, problems: problems.map { $0.description })
        } catch {
            again = .thrown(error.description)
        }
        invariant(again == outcome, "from a String: \(again), from bytes: \(outcome)")
    }
}

enum Outcome: Equatable {
    case composed(hasRoot: Bool, problems: [String])
    case thrown(String)
}

/// Depth and places, iteratively, within `nodeBudget`.
func checkTree(_ root: YAMLNode, lines: Int) {
    var stack: [(node: YAMLNode, depth: Int)] = [(root, 0)]
    var visited = 0
    while let (node, depth) = stack.popLast(), visited < nodeBudget {
        visited += 1
        invariant((1...lines).contains(node.line) && node.column >= 1, "a node at \(node.line):\(node.column)")
        switch node.kind {
        case .scalar:
            break
        case .sequence(let items):
            invariant(depth < YAMLComposer.maxDepth, "a list \(depth + 1) levels deep")
            for item in items { stack.append((item, depth + 1)) }
        case .mapping(let pairs):
            invariant(depth < YAMLComposer.maxDepth, "a mapping \(depth + 1) levels deep")
            for pair in pairs {
                stack.append((pair.key, depth + 1))
                stack.append((pair.value, depth + 1))
            }
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
