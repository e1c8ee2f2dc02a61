// BatonRelay's `L2CAPListener`, the listening side of an L2CAP LE credit-based channel that
// `baton device` (and a re-advertising gateway) accepts links on: its errors on this kernel
// (no Bluetooth here; in the VM test, Tests/VM/bluez-test.sh, an adapter that is not there).
import BatonRelay
import CBlueZ
import Glibc
import Testing

@Suite struct L2CAPListenerTests {
    @Test func onThisKernel() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)  // BTPROTO_L2CAP
        let probeErrno = Glibc.errno
        if probe < 0 {
            try #require(probeErrno == EAFNOSUPPORT, "socket(AF_BLUETOOTH) failed with errno \(probeErrno), not EAFNOSUPPORT")
            #expect(throws: LinkError.noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable)")) {
                _ = try L2CAPListener(adapter: "hci0", psm: 0, receiveMTU: 1029)
            }
            // `baton sim sensor`'s ATT listener (docs/simulator.md "A sensor to connect to").
            #expect(throws: LinkError.noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable)")) {
                _ = try L2CAPListener(attributesOn: "hci0")
            }
        } else {
            close(probe)
            // The VM: hci99 is not there.
            #expect(throws: LinkError.noBluetooth("no Bluetooth adapter named hci99 (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)")) {
                _ = try L2CAPListener(adapter: "hci99", psm: 0, receiveMTU: 1029)
            }
            #expect(throws: LinkError.noBluetooth("no Bluetooth adapter named hci99 (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)")) {
                _ = try L2CAPListener(attributesOn: "hci99")
            }
        }
        // Not an LE PSM: refused before any socket is made (Core 5.4, Vol 3, Part A, §4.22).
        #expect(throws: LinkError.cannotListen("PSM 0x0100 is not an LE PSM (0x0001 to 0x00FF, Core 5.4, Vol 3, Part A, §4.22)")) {
            _ = try L2CAPListener(adapter: "hci0", psm: 0x100, receiveMTU: 1029)
        }
        #expect(LinkError.cannotListen("PSM 0x0080 on hci1 is taken by another program (choose another with --psm, or 0 for any)").description
            == "cannot offer a device link: PSM 0x0080 on hci1 is taken by another program (choose another with --psm, or 0 for any)")
    }
}
