package sluice.parse;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Pattern;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A Kafka value read once, in one pass over its bytes: the typed row and the fields the
 * schema does not declare (their JSON text, by path), or NULL when the record needs the
 * reference parse (from_json, the VARIANT, the checks and the reason).
 *
 * <p>It answers only for a record it can read exactly: strict UTF-8 JSON, one object, every
 * declared value of the kind its type takes (a string for STRING, an integer in range for
 * INT and BIGINT, a finite number for DOUBLE, true or false for BOOLEAN), no key twice, and
 * every required field present, valid UTF-8 as Spark's is_valid_utf8 has it, at most 1 MiB,
 * under a schema whose names the reference can write as JSON paths and without default values.
 * Anything else (a type it does not read, a value from_json would change or refuse, a missing
 * field, a byte-order mark) is NULL, and the caller takes the reference path,
 * so the two can only differ where this class claims a record. Arguments: the value's bytes
 * and the schema as Spark's JSON.
 */
public final class OnePass implements UDF2<byte[], String, Row> {
  // Duplicate keys anywhere, even inside an undeclared value, leave the record to the
  // reference; names are not interned (keys that keep changing would fill the JVM's table).
  private static final JsonFactory JSON =
      JsonFactory.builder()
          .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
          .disable(JsonFactory.Feature.INTERN_FIELD_NAMES)
          .build();
  /** A name that needs no backticks in a rescued path (see display and undeclared). */
  private static final Pattern PLAIN = Pattern.compile("^[A-Za-z0-9_]+$");
  private static final Object UNSURE = new Object();
  /** At most 9 bytes of VARIANT per byte of JSON: 1 MiB stays below the VARIANT's 16 MiB. */
  private static final int MAX_BYTES = 1 << 20;

  /** The schema a call names, with each struct's field positions by name; read-only once built. */
  private static final class Compiled {
    final String json;
    final StructType schema;
    final Map<StructType, Map<String, Integer>> positions = new IdentityHashMap<>();
    /** False when a record under this schema always takes the reference (see readable(StructField)). */
    boolean readable = true;

    Compiled(String json) {
      this.json = json;
      this.schema = (StructType) DataType.fromJson(json);
      index(schema);
    }

    private void index(DataType t) {
      if (t instanceof StructType s) {
        Map<String, Integer> m = new HashMap<>();
        StructField[] fields = s.fields();
        for (int i = 0; i < fields.length; i++) {
          readable &= readable(fields[i]);
          m.put(fields[i].name(), i);
          index(fields[i].dataType());
        }
        positions.put(s, m);
      } else if (t instanceof ArrayType a) {
        index(a.elementType());
      }
    }

    /**
     * A field the reference reads by a JSON path (its checks, its rescued fields) must have a
     * name sluice.spec.quarantine.json_path writes as one: no '.', ' or ']'. And a
     * default value (Spark's EXISTS_DEFAULT metadata) is one from_json fills in for an
     * absent field.
     */
    private static boolean readable(StructField f) {
      String name = f.name();
      return name.indexOf('.') < 0
          && name.indexOf('\'') < 0
          && name.indexOf(']') < 0
          && !f.metadata().contains("EXISTS_DEFAULT")
          && !f.metadata().contains("CURRENT_DEFAULT");
    }
  }

  // Tasks may share this instance: a call only reads it, and replaces it whole.
  private transient volatile Compiled compiled;

  @Override
  public Row call(byte[] value, String schemaJson) {
    // A larger value could make a VARIANT over its 16 MiB limit, which the reference reports.
    if (value == null || value.length > MAX_BYTES) {
      return null;
    }
    try {
      Compiled c = compiled;
      if (c == null || !c.json.equals(schemaJson)) {
        c = new Compiled(schemaJson);
        compiled = c;
      }
      // The reference's first test (is_valid_utf8) exactly; Jackson's decoder takes overlong
      // forms and surrogates. And the first byte must open the object: a byte-order mark or
      // UTF-16 would be skipped or decoded by Jackson, where the reference finds no JSON.
      if (!c.readable || !startsWithObject(value) || !UTF8String.fromBytes(value).isValid()) {
        return null;
      }
      return new Read(c, value).record();
    } catch (RuntimeException e) {
      return null;
    }
  }

  /** One value's read. */
  private static final class Read {
    private final Compiled compiled;
    private final byte[] bytes;

    Read(Compiled compiled, byte[] bytes) {
      this.compiled = compiled;
      this.bytes = bytes;
    }

    Row record() {
      try (JsonParser p = JSON.createParser(bytes)) {
        if (p.nextToken() != JsonToken.START_OBJECT) {
          return null;
        }
        Map<String, String> rescued = new LinkedHashMap<>();
        Row data = struct(p, compiled.schema, null, rescued);
        if (data == null || p.nextToken() != null) {
          return null;
        }
        return RowFactory.create(data, rescued.isEmpty() ? null : rescued);
      } catch (IOException | RuntimeException e) {
        return null;
      }
    }

    /** The object at the parser (its START_OBJECT read), or null when unsure. */
    private Row struct(JsonParser p, StructType t, String path, Map<String, String> rescued)
        throws IOException {
      StructField[] fields = t.fields();
      Object[] values = new Object[fields.length];
      boolean[] seen = new boolean[fields.length];
      Map<String, Integer> positions = compiled.positions.get(t);
      // Rescued fields in the order sluice.spec.rescue gives them: this object's own by name as
      // sent (a VARIANT object keeps its keys sorted), then each declared field's, in schema order.
      Map<String, String[]> own = null;
      List<Map<String, String>> children = null;
      JsonToken token;
      while ((token = p.nextToken()) == JsonToken.FIELD_NAME) {
        String name = p.currentName();
        p.nextToken();
        Integer i = positions.get(name);
        if (i == null) {
          own = own == null ? new TreeMap<>() : own;
          if (own.put(name, new String[] {child(path, undeclared(name)), text(p)}) != null) {
            return null;
          }
          continue;
        }
        if (seen[i]) {
          return null;
        }
        seen[i] = true;
        DataType type = fields[i].dataType();
        Map<String, String> inner = null;
        String at = null;
        if (type instanceof StructType || type instanceof ArrayType) {
          inner = new LinkedHashMap<>();
          at = child(path, display(name));
          if (children == null) {
            children = new ArrayList<>(fields.length);
            for (int k = 0; k < fields.length; k++) {
              children.add(null);
            }
          }
          children.set(i, inner);
        }
        Object v = value(p, type, at, inner);
        if (v == UNSURE) {
          return null;
        }
        values[i] = v;
      }
      if (token != JsonToken.END_OBJECT) {
        return null;
      }
      for (int i = 0; i < fields.length; i++) {
        if (values[i] == null && !fields[i].nullable()) {
          return null;
        }
      }
      if (own != null) {
        for (String[] entry : own.values()) {
          rescued.put(entry[0], entry[1]);
        }
      }
      if (children != null) {
        for (Map<String, String> inner : children) {
          if (inner != null) {
            rescued.putAll(inner);
          }
        }
      }
      return RowFactory.create(values);
    }

    /** The value at the parser as ``t``, or UNSURE; {@code path} and {@code rescued} only for a struct or array. */
    private Object value(JsonParser p, DataType t, String path, Map<String, String> rescued)
        throws IOException {
      JsonToken token = p.currentToken();
      if (token == JsonToken.VALUE_NULL) {
        return null;
      }
      if (t instanceof StringType) {
        return token == JsonToken.VALUE_STRING ? p.getText() : UNSURE;
      }
      if (t instanceof LongType || t instanceof IntegerType) {
        if (token != JsonToken.VALUE_NUMBER_INT || p.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
          return UNSURE;
        }
        long v = p.getLongValue();
        if (t instanceof IntegerType) {
          return v == (int) v ? (Object) (int) v : UNSURE;
        }
        return v;
      }
      if (t instanceof DoubleType) {
        if (token != JsonToken.VALUE_NUMBER_INT && token != JsonToken.VALUE_NUMBER_FLOAT) {
          return UNSURE;
        }
        double v = p.getDoubleValue();
        return Double.isFinite(v) ? (Object) v : UNSURE;
      }
      if (t instanceof BooleanType) {
        return token == JsonToken.VALUE_TRUE ? Boolean.TRUE : token == JsonToken.VALUE_FALSE ? Boolean.FALSE : UNSURE;
      }
      if (t instanceof StructType s) {
        if (token != JsonToken.START_OBJECT) {
          return UNSURE;
        }
        Row row = struct(p, s, path, rescued);
        return row == null ? UNSURE : row;
      }
      if (t instanceof ArrayType a) {
        if (token != JsonToken.START_ARRAY) {
          return UNSURE;
        }
        DataType element = a.elementType();
        boolean nested = element instanceof StructType || element instanceof ArrayType;
        List<Object> items = new ArrayList<>();
        int n = 0;
        while (p.nextToken() != JsonToken.END_ARRAY) {
          Object v = value(p, element, nested ? path + "[" + n + "]" : null, rescued);
          n++;
          if (v == UNSURE || (v == null && !a.containsNull())) {
            return UNSURE;
          }
          items.add(v);
        }
        return items;
      }
      return UNSURE;
    }

    /**
     * The value at the parser as it was sent: its bytes, which the caller reads as a VARIANT
     * (a copy through Jackson's generator could write a number otherwise, 1E+2 as 100).
     */
    private String text(JsonParser p) throws IOException {
      long start = p.currentTokenLocation().getByteOffset();
      if (p.currentToken() == JsonToken.VALUE_STRING) {
        p.getText(); // Jackson reads a string's end only when asked for it
      }
      p.skipChildren();
      long end = p.currentLocation().getByteOffset();
      return new String(bytes, (int) start, (int) (end - start), StandardCharsets.UTF_8);
    }
  }

  /**
   * The first byte opens the object and no byte is NUL: JSON has no raw NUL, and Jackson
   * reads a value of ASCII and NULs as UTF-16 or UTF-32 where the reference reads UTF-8.
   */
  private static boolean startsWithObject(byte[] value) {
    int i = 0;
    while (i < value.length && (value[i] == ' ' || value[i] == '\t' || value[i] == '\n' || value[i] == '\r')) {
      i++;
    }
    if (i == value.length || value[i] != '{') {
      return false;
    }
    for (; i < value.length; i++) {
      if (value[i] == 0) {
        return false;
      }
    }
    return true;
  }

  private static String child(String path, String name) {
    return path == null ? name : path + "." + name;
  }

  /** A name in a rescued path, as sluice.spec.rescue.display writes it. */
  /** A declared name in a rescued path, as sluice.spec.rescue.display writes it (Python's fullmatch). */
  private static String display(String name) {
    return PLAIN.matcher(name).matches() ? name : quoted(name);
  }

  /** An undeclared name in a rescued path, as sluice.spec.rescue._display_sql writes it (Spark's RLIKE). */
  private static String undeclared(String name) {
    return PLAIN.matcher(name).find() ? name : quoted(name);
  }

  private static String quoted(String name) {
    return "`" + name.replace("`", "``") + "`";
  }
}
