// What a toolbox command says to its user: one line on stderr, "baton <command>: <text>", the
// way every command reports a failure, a warning or what it found (each command's help says
// which lines go there). The gateway logs in journald's form instead (`Logger`, BatonGateway).
import Foundation

enum Stderr {
    /// "baton <command>: <text>" and a newline.
    static func say(_ command: String, _ text: String) {
        line("baton \(command): \(text)")
    }

    /// `text` as it is, and a newline: a message that names its source itself.
    static func line(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}
