// Fuzz target: what a GATT server sends a client (Core 5.4, Vol 3, Part F, §3.4), one ATT PDU
// as one L2CAP SDU, so a crash file is a PDU you can read with `xxd`.
// Invariants:
//   * decoding never traps; an error names a byte of the input: `truncated` where a fixed
//     field (1 or 2 bytes) runs past the end, `malformed` at a byte inside it (`att-length` where a fixed
//     size PDU runs on, `att-list`, `att-format`); no other error kind;
//   * what decodes matches its opcode: the response opcodes give their case, any other a
//     request or, with bit 6, a command;
//   * a value lies inside the PDU after its fixed part and runs to its end; a list's entries
//     tile the PDU from byte 2 to its end, none empty, at least one;
//   * every entry of a Read By Group Type, Read By Type or Find Information list decodes as a
//     service, characteristic or descriptor exactly when its UUID part is 2 or 16 bytes, and
//     a decoded 16-bit UUID gives back its short form.
import BatonWire
import FuzzSupport

func check(_ pdu: UnsafeRawBufferPointer) {
    let n = pdu.count
    let decoded: ATTServerPDU
    do throws(WireError) {
        decoded = try ATTServerPDU.decode(pdu)
    } catch {
        switch error {
        case .truncated(let at, let need):
            // A fixed part is read a byte or a 16-bit field at a time: 1 or 2 bytes short.
            // Only an empty input is cut short at byte 0 (the opcode).
            invariant(at <= n && (need == 1 || need == 2) && (at > 0 || n == 0), "\(error) in \(n) bytes")
        case .malformed(let at, let reason):
            invariant(at <= n, "\(error) in \(n) bytes")
            invariant(reason == .attLength || reason == .attList || reason == .attFormat, "\(reason)")
        default:
            invariant(false, "unexpected \(error)")
        }
        return
    }
    let opcode = pdu[0]
    switch decoded {
    case .error: invariant(opcode == ATTOpcode.errorResponse && n == 5, "error from \(hex(pdu))")
    case .exchangeMTU: invariant(opcode == ATTOpcode.exchangeMTUResponse && n == 3, "mtu from \(hex(pdu))")
    case .written: invariant(opcode == ATTOpcode.writeResponse && n == 1, "written from \(hex(pdu))")
    case .read(let v), .readBlob(let v):
        invariant(v == 1 ..< n, "value \(v) of \(n) bytes")
    case .notification(_, let v), .indication(_, let v):
        invariant(v == 3 ..< n, "value \(v) of \(n) bytes")
    case .request(let o):
        invariant(o == opcode && o & ATTOpcode.commandFlag == 0, "request \(o)")
    case .command(let o):
        invariant(o == opcode && o & ATTOpcode.commandFlag != 0, "command \(o)")
    case .information(let list):
        checkList(list, n)
        invariant(list.entrySize == 4 || list.entrySize == 18, "entry size \(list.entrySize)")
        entries(list, pdu, uuidFrom: 2) { e, at throws(WireError) in _ = try GATTDescriptor.decode(e, at: at).uuid }
    case .byType(let list):
        checkList(list, n)
        entries(list, pdu, uuidFrom: 5) { e, at throws(WireError) in _ = try GATTCharacteristic.decode(e, at: at).uuid }
    case .byGroupType(let list):
        checkList(list, n)
        entries(list, pdu, uuidFrom: 4) { e, at throws(WireError) in _ = try GATTService.decode(e, at: at).uuid }
    }
}

func checkList(_ list: ATTList, _ n: Int) {
    invariant(list.start == 2 && list.count >= 1 && list.entrySize >= 1, "list \(list)")
    invariant(list.start + list.count * list.entrySize == n, "list \(list) in \(n) bytes")
    invariant(list.entry(list.count - 1).upperBound == n, "last entry of \(list)")
}

/// Each entry decodes exactly when its UUID part (after `uuidFrom` bytes) is 2 or 16 bytes; a
/// short UUID round-trips. Entries shorter than their fixed part fail as truncated.
func entries(_ list: ATTList, _ pdu: UnsafeRawBufferPointer, uuidFrom: Int,
             _ decode: (UnsafeRawBufferPointer, Int) throws(WireError) -> Void) {
    for i in 0..<list.count {
        let r = list.entry(i)
        let entry = UnsafeRawBufferPointer(rebasing: pdu[r])
        let uuidCount = entry.count - uuidFrom
        do throws(WireError) {
            try decode(entry, r.lowerBound)
            invariant(uuidCount == 2 || uuidCount == 16, "entry \(hex(entry)) decoded with a \(uuidCount)-byte UUID")
            if uuidCount == 2 {
                let short = UInt16(entry[uuidFrom]) | UInt16(entry[uuidFrom + 1]) << 8
                invariant(GATTUUID(short: short).short == short, "UUID \(short)")
            }
        } catch {
            switch error {
            case .truncated: invariant(uuidCount < 0, "entry \(hex(entry)): \(error)")
            case .malformed(let at, let reason):
                invariant(reason == .gattDeclaration && at == r.lowerBound + uuidFrom, "entry at \(r): \(error)")
                invariant(uuidCount != 2 && uuidCount != 16, "entry \(hex(entry)) refused with a \(uuidCount)-byte UUID")
            default: invariant(false, "entry \(hex(entry)): unexpected \(error)")
            }
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
