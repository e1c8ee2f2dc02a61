// The firmware's entry point: `baton gateway [flags]` and `baton --version` on a gateway, built
// as Embedded Swift by scripts/firmware for amd64, arm64 and armhf (docs/firmware.md). The same
// file builds as full Swift with the package, so the tests run what the firmware runs.
import BatonGateway
import BatonLibc
import CLibc

#if $Embedded
// Embedded Swift has no `CommandLine`: the C entry point hands over argc and argv.
@_cdecl("main")
func main(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
    var arguments: [String] = []
    for i in 0..<Int(argc) {
        arguments.append(argv[i].map { String(cString: $0) } ?? "")
    }
    return GatewayMain.firmware(arguments)
}
#else
@main
enum Firmware {
    static func main() { exit(GatewayMain.firmware(CommandLine.arguments)) }
}
#endif
