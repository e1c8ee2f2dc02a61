// RadioBlueZ: what a user sees on this kernel (with or without Bluetooth), adapter names, the
// socket filter against libbluetooth's own helpers, and the kernel-owned init sequence over a
// SOCK_SEQPACKET stand-in that behaves like the raw HCI socket (one packet per read, H4 type
// byte first).

import BatonLibc
import Glibc
import Testing
import BatonTestSupport
import CBlueZ
import BatonWire
@testable import BatonHCI

/// Runs the sequence against a well-behaved controller; returns the frames it received.
private func runInit(_ radio: inout RadioBlueZ, _ ctl: RadioFakeController, now: Instant,
                     features: UInt64) throws -> [[UInt8]] {
    var frames: [[UInt8]] = []
    while radio.state == .initialising, frames.count < 16 {
        guard let frame = ctl.nextCommand() else {
            Issue.record("no command arrived")
            break
        }
        frames.append(frame)
        ctl.answer(frame, features: features)
        _ = try radio.poll(now: now) { _ in Issue.record("an event leaked out during init") }
    }
    return frames
}

@Suite("RadioBlueZ: the raw HCI socket")
struct RadioBlueZTests {
    let t0 = Instant.now

    @Test("Opening on this kernel: no AF_BLUETOOTH says so exactly; with Bluetooth, hci99 is not found")
    func openOnThisKernel() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_HCI)
        let probeErrno = Glibc.errno
        if probe < 0 {
            // A kernel without Bluetooth (these build machines).
            try #require(probeErrno == EAFNOSUPPORT, "socket(AF_BLUETOOTH) failed with errno \(probeErrno), not EAFNOSUPPORT")
            for adapter in ["hci0", "hci99", "00:11:22:33:44:55"] {
                do {
                    _ = try RadioBlueZ(adapter: adapter)
                    Issue.record("opening \(adapter) succeeded without AF_BLUETOOTH")
                } catch {
                    #expect(error == .noBluetoothSupport)
                    #expect(error.description ==
                        "this kernel has no Bluetooth support, or a sandbox denies it (AF_BLUETOOTH unavailable; a systemd unit needs AF_BLUETOOTH in RestrictAddressFamilies=): run on a machine with BlueZ, or give another radio source: radio.source in the config or --radio (capture:FILE replays a btsnoop or pcap capture, h4:/dev/ttyACM0 a serial controller; docs/config.md)")
                }
            }
        } else {
            // A kernel with Bluetooth (the qemu VM): a non-existent adapter is named as such.
            Glibc.close(probe)
            do {
                _ = try RadioBlueZ(adapter: "hci99")
                Issue.record("opening hci99 succeeded")
            } catch {
                #expect(error == .adapterNotFound("hci99"))
                #expect(error.description ==
                    "no Bluetooth adapter named hci99 (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)")
            }
        }
    }

    @Test("Adapter names: hciN with N in 0…0xFFFE, or an address; anything else is a configuration error")
    func adapterNames() throws {
        #expect(RadioBlueZ.parseAdapterName("hci0") == 0)
        #expect(RadioBlueZ.parseAdapterName("hci99") == 99)
        #expect(RadioBlueZ.parseAdapterName("hci65534") == 65534)
        #expect(RadioBlueZ.parseAdapterName("hci65535") == nil)  // HCI_DEV_NONE
        #expect(RadioBlueZ.parseAdapterName("hci") == nil)
        #expect(RadioBlueZ.parseAdapterName("hci-1") == nil)
        #expect(RadioBlueZ.parseAdapterName("hci+1") == nil)
        #expect(RadioBlueZ.parseAdapterName("hcix") == nil)
        #expect(RadioBlueZ.parseAdapterName("HCI0") == nil)
        #expect(RadioBlueZ.parseAdapterName("hci000000001") == nil)
        #expect(RadioBlueZ.isAddress("00:1a:7D:DA:71:13"))
        #expect(!RadioBlueZ.isAddress("00:1A:7D:DA:71"))
        #expect(!RadioBlueZ.isAddress("00-1A-7D-DA-71-13"))
        #expect(!RadioBlueZ.isAddress("00:1A:7D:DA:71:1G"))
        for bad in ["", "wlan0", "hci", "hci0x", "/dev/ttyUSB0"] {
            #expect(throws: RadioError.self) { _ = try RadioBlueZ(adapter: bad) }
            do {
                _ = try RadioBlueZ(adapter: bad)
            } catch {
                #expect(error == .invalidConfiguration(
                    "adapter \"\(bad)\" is neither hciN (e.g. hci0) nor an adapter address (AA:BB:CC:DD:EE:FF)"))
            }
        }
    }

    @Test("Errno mapping when opening: each case says what to do")
    func openErrors() {
        #expect(RadioBlueZ.openError(EAFNOSUPPORT, adapter: "hci0", call: "socket") == .noBluetoothSupport)
        #expect(RadioBlueZ.openError(ENODEV, adapter: "hci3", call: "bind") == .adapterNotFound("hci3"))
        #expect(RadioBlueZ.openError(132, adapter: "hci0", call: "ioctl") == .adapterBlocked("hci0"))
        let denied = RadioBlueZ.openError(EPERM, adapter: "hci0", call: "setsockopt")
        #expect(denied.description.hasPrefix("scanning through hci0's raw HCI socket needs CAP_NET_RAW"))
        #expect(RadioBlueZ.openError(EIO, adapter: "hci0", call: "bind") == .os(Errno(EIO, call: "bind")))
        #expect(RadioError.adapterBlocked("hci0").description ==
            "Bluetooth adapter hci0 is blocked by rfkill (`rfkill unblock bluetooth`)")
    }

    @Test("HCIDEVUP restated from <bluetooth/hci.h>: _IOW('H', 201, int)")
    func ioctlNumber() {
        // asm-generic/ioctl.h: _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr.
        let iocWrite: UInt = 1
        let expected = iocWrite << 30 | UInt(MemoryLayout<Int32>.size) << 16 | UInt(UInt8(ascii: "H")) << 8 | 201
        #expect(RadioBlueZ.hciDevUp == expected)
    }

    @Test("The socket filter equals what libbluetooth's hci_filter_* helpers build")
    func filterMatchesLibbluetooth() {
        var reference = hci_filter()
        hci_filter_clear(&reference)
        hci_filter_set_ptype(Int32(HCI_EVENT_PKT), &reference)
        hci_filter_set_ptype(Int32(HCI_COMMAND_PKT), &reference)
        hci_filter_set_event(Int32(EVT_CMD_COMPLETE), &reference)
        hci_filter_set_event(Int32(EVT_CMD_STATUS), &reference)
        hci_filter_set_event(0x10, &reference)  // EVT_HARDWARE_ERROR
        hci_filter_set_event(Int32(EVT_LE_META_EVENT), &reference)
        let ours = RadioBlueZ.eventFilter()
        #expect(ours.type_mask == reference.type_mask)
        #expect(ours.event_mask.0 == reference.event_mask.0)
        #expect(ours.event_mask.1 == reference.event_mask.1)
        #expect(ours.opcode == 0)
        // And the bits by hand: types 1 and 4; events 14, 15, 16 in the low word, 62 in the high word.
        #expect(ours.type_mask == 0x0000_0012)
        #expect(ours.event_mask.0 == 0x0001_C000)
        #expect(ours.event_mask.1 == 0x4000_0000)
        #expect(MemoryLayout<hci_filter>.stride == 16)  // sizeof(struct hci_ufilter) in the kernel
    }

    @Test("Kernel-owned init on a 5.x controller: no Reset, no masks; stop scan, extended params, enable")
    func initExtended() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        let frames = try runInit(&radio, ctl, now: t0, features: 0x19FF)
        #expect(frames.map(spacedHex) == [
            "01 01 10 00",                       // §7.4.1 Read_Local_Version_Information
            "01 03 20 00",                       // §7.8.3 LE_Read_Local_Supported_Features
            "01 42 20 06 00 00 00 00 00 00",     // §7.8.65 disable whatever the kernel was scanning
            "01 41 20 08 00 00 01 00 60 00 60 00", // §7.8.64
            "01 42 20 06 01 00 00 00 00 00",     // §7.8.65 enable, duplicates not filtered
        ])
        do { let s = radio.state; #expect(s == .scanning) }
        do { let e = radio.usesExtendedScanning; #expect(e) }

        // Reports arrive one per datagram with the type byte; they come out without it.
        ctl.send([0x04] + radioLegacyReport)
        ctl.send([0x04] + radioExtendedReport)
        var got: [[UInt8]] = []
        #expect(try radio.poll(now: t0) { got.append(Array($0)) } == 2)
        #expect(got == [radioLegacyReport, radioExtendedReport])
    }

    @Test("Kernel-owned init on a 4.2 controller: legacy disable/params/enable; Command Disallowed on disable is fine")
    func initLegacyDisallowedDisable() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        var frames: [String] = []
        while frames.count < 8 {
            do { let s = radio.state; if s != .initialising { break } }
            let frame = try #require(ctl.nextCommand())
            frames.append(spacedHex(frame))
            if radioOpcode(frame) == 0x200C && frame[4] == 0x00 {
                ctl.complete(0x200C, status: 0x0C)  // not scanning: Command Disallowed
            } else {
                ctl.answer(frame, features: 0x003F)
            }
            _ = try radio.poll(now: t0) { _ in }
        }
        #expect(frames == [
            "01 01 10 00",
            "01 03 20 00",
            "01 0C 20 02 00 00",                 // §7.8.11 disable
            "01 0B 20 07 00 60 00 60 00 00 00",  // §7.8.10
            "01 0C 20 02 01 00",                 // §7.8.11 enable, Filter_Duplicates 0
        ])
        do { let s = radio.state; #expect(s == .scanning) }
    }

    @Test("The kernel's own Command Completes are not ours: credits only, never delivered, never matched")
    func foreignCommandComplete() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        let first = try #require(ctl.nextCommand())
        #expect(radioOpcode(first) == 0x1001)
        // bluetoothd's Read Local Name (0x0C14) completes meanwhile.
        ctl.complete(0x0C14, returning: [UInt8](repeating: 0x41, count: 8))
        var leaked = 0
        _ = try radio.poll(now: t0) { _ in leaked += 1 }
        #expect(leaked == 0)
        do { let s = radio.state; #expect(s == .initialising) }
        // Still waiting for our answer: nothing new was sent.
        #expect(ctl.nextCommand(timeoutMs: 100) == nil)
        ctl.answer(first, features: 0)
        _ = try radio.poll(now: t0) { _ in leaked += 1 }
        #expect(radioOpcode(try #require(ctl.nextCommand())) == 0x2003)
        #expect(leaked == 0)
    }

    @Test("An error status during init names the command and the status")
    func errorStatus() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, RadioConfig(mode: .extended), now: t0)
        _ = try #require(ctl.nextCommand())
        ctl.complete(0x1001, status: 0x01)  // Unknown HCI Command
        do {
            _ = try radio.poll(now: t0) { _ in }
            Issue.record("no error")
        } catch {
            #expect(error.description ==
                "the Bluetooth controller refused HCI_Read_Local_Version_Information (0x1001): Unknown HCI Command (0x01)")
        }
        do { let s = radio.state; #expect(s == .stopped) }
    }

    @Test("A packet whose length disagrees is dropped and counted; the next one still flows")
    func malformedDatagram() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = RadioBlueZ(descriptor: ctl.radioEnd, adapter: "hci0", config: RadioConfig())
        ctl.send(hx("04 3E 05 02 01"))     // declares 5 parameter bytes, has 2
        ctl.send(hx("04 3E"))              // no length at all
        ctl.send(hx("02 01 00 00 00"))     // an ACL packet, not an event
        ctl.send([0x04] + radioLegacyReport)
        var got: [[UInt8]] = []
        #expect(try radio.poll(now: t0) { got.append(Array($0)) } == 1)
        #expect(got == [radioLegacyReport])
        do { let m = radio.malformedEvents; #expect(m == 2) }
        do { let n = radio.nonEventPackets; #expect(n == 1) }
    }

    @Test("The adapter going away (EPIPE/ENETDOWN on the socket) is .adapterDown")
    func adapterGone() throws {
        let (a, b) = seqpacketPair()
        try Syscall.setNonBlocking(a)
        var radio = RadioBlueZ(descriptor: a, adapter: "hci0", config: RadioConfig())
        Glibc.close(b)
        // Writing to a SEQPACKET socket whose peer is gone fails with EPIPE (sent with
        // MSG_NOSIGNAL, so no SIGPIPE), like the raw socket once the device is unregistered.
        do {
            try radio.start(now: t0)
            Issue.record("no error")
        } catch {
            #expect(error == .adapterDown("hci0"))
            #expect(error.description == "Bluetooth adapter hci0 went down or was removed")
        }
    }
}
