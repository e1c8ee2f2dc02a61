// What `YAMLComposer` makes of a file: scalars, sequences and mappings, each with the line and
// column it starts on, so a reader names the line of every problem. A plain value composes with
// the tag libyaml gives it, none: whether `yes` is a boolean or `101` a number is the reader's
// decision for its key (docs/config.md "Format"), not YAML's.

/// One node of a YAML document.
public struct YAMLNode: Equatable {
    public enum Kind: Equatable {
        case scalar(YAMLScalar)
        case sequence([YAMLNode])
        /// In file order; a key given twice is kept twice, for the reader to report.
        case mapping([YAMLPair])
    }

    public var kind: Kind
    /// Where the node starts, from 1, as libyaml counts them (columns in Unicode scalars). A
    /// node an alias stands for keeps its anchor's place, as Yams' did.
    public var line: Int
    public var column: Int

    public init(_ kind: Kind, line: Int, column: Int) {
        self.kind = kind; self.line = line; self.column = column
    }

    public var scalar: YAMLScalar? {
        if case .scalar(let s) = kind { return s }
        return nil
    }
}

/// One `key: value` of a mapping. Keys are nodes: `[a, b]: c` is a mapping's key too.
public struct YAMLPair: Equatable {
    public var key: YAMLNode
    public var value: YAMLNode
    public init(key: YAMLNode, value: YAMLNode) { self.key = key; self.value = value }
}

public struct YAMLScalar: Equatable {
    /// YAML 1.2 §7.3 (flow) and §8.1 (block scalars).
    public enum Style: Equatable, CustomStringConvertible {
        case plain, singleQuoted, doubleQuoted, literal, folded

        public var description: String {
            switch self {
            case .plain: "plain"
            case .singleQuoted: "single-quoted"
            case .doubleQuoted: "double-quoted"
            case .literal: "literal"
            case .folded: "folded"
            }
        }
    }

    /// The value after YAML's escapes and folding; it may hold NUL (`"\0"`).
    public var string: String
    public var style: Style

    public init(_ string: String, style: Style = .plain) { self.string = string; self.style = style }

    /// Plain: written without quotes or `|`/`>`. Only a plain scalar can be YAML's null.
    public var isPlain: Bool { style == .plain }
}
